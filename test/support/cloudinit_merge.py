"""Merges user-data the way cloud-init does, with cloud-init's own code.

Usage: /usr/bin/python3 cloudinit_merge.py USER_DATA_FILE
Prints JSON: the parts cloud-init's UserDataProcessor finds (content type,
filename) and the cloud-config that CloudConfigPartHandler merges from the
cloud-config parts, in order. Runs no cloud-init stage, touches nothing.
"""
import json
import sys
import tempfile

from cloudinit import handlers, helpers, user_data
from cloudinit.handlers.cloud_config import CloudConfigPartHandler


def main(path):
    with open(path, "rb") as stream:
        blob = stream.read()
    with tempfile.TemporaryDirectory() as scratch:
        paths = helpers.Paths({"cloud_dir": scratch, "run_dir": scratch})
        message = user_data.UserDataProcessor(paths).process(blob)
        handler = CloudConfigPartHandler(paths)
        handler.handle_part(None, handlers.CONTENT_START, None, None, None, None)
        parts = []
        for part in message.walk():
            if part.get_content_maintype() == "multipart":
                continue
            content_type = part.get_content_type()
            filename = part.get_filename() or "part"
            parts.append({"type": content_type, "filename": filename})
            if content_type == "text/cloud-config":
                payload = part.get_payload(decode=True).decode("utf-8")
                handler.handle_part(None, content_type, filename, payload, None, dict(part.items()))
        json.dump({"parts": parts, "merged": handler.cloud_buf}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
