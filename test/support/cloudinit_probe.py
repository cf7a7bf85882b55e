"""Reads an extracted NoCloud seed the way cloud-init does, with cloud-init's own code.

Usage: /usr/bin/python3 cloudinit_probe.py SEED_DIR
Prints JSON: the raw files as NoCloud's pathprefix2dict returns them, the parsed
meta-data, and for user-data and vendor-data the parts cloud-init's
UserDataProcessor produces (content type, filename, payload, and the payload as
the part handlers are given it), base64-encoded.
Runs no cloud-init stage and touches nothing on the host.
"""
import base64
import json
import sys
import tempfile

from cloudinit import handlers, helpers, user_data, util


def b64(data):
    if data is None:
        return None
    if isinstance(data, str):
        data = data.encode("utf-8")
    return base64.b64encode(data).decode("ascii")


def parts_of(blob, paths):
    if blob is None:
        return None
    try:
        message = user_data.UserDataProcessor(paths).process(blob)
    except Exception as error:  # binary user-data: cloud-init cannot decode it either
        return [{"error": "%s: %s" % (type(error).__name__, error)}]
    parts = []
    for part in message.walk():
        if part.get_content_maintype() == "multipart":
            continue
        payload = part.get_payload(decode=True)
        try:
            sniffed = handlers.type_from_starts_with(util.decode_binary(payload)) if payload else None
        except UnicodeDecodeError:
            sniffed = None
        # What the part handlers are given (handlers.walk): text decoded by the part's charset.
        handed = util.fully_decoded_payload(part)
        if isinstance(handed, str):
            handed = handed.encode("utf-8", "surrogateescape")
        parts.append(
            {
                "type": part.get_content_type(),
                "filename": part.get_filename(),
                "payload": b64(payload),
                "handed": b64(handed),
                "sniffed": sniffed,
            }
        )
    return parts


def main(seed_dir):
    # Exactly the call DataSourceNoCloud makes on a mounted seed.
    seeded = util.pathprefix2dict(
        seed_dir, required=["user-data", "meta-data"], optional=["vendor-data", "network-config"]
    )
    with tempfile.TemporaryDirectory() as scratch:
        paths = helpers.Paths({"cloud_dir": scratch, "run_dir": scratch})
        result = {
            "files": {name: b64(content) for name, content in seeded.items()},
            "metaData": util.load_yaml(seeded["meta-data"]),
            "userDataParts": parts_of(seeded["user-data"], paths),
            "vendorDataParts": parts_of(seeded.get("vendor-data"), paths),
        }
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
