import assert from "node:assert/strict";
import { createServer as createHttpServer, type IncomingMessage } from "node:http";
import { createServer } from "node:net";
import { Deadline, retryWithBackoff } from "../../provider/common/deadline";
import { PermanentError, TransientError } from "../../provider/common/errors";
import { waitForProxyAuthRequired, waitForTcpPort } from "../../provider/common/readiness";

describe("common deadline, backoff and readiness", () => {
  it("caps every per-call timeout at what is left of the deadline", () => {
    const deadline = new Deadline(1000, "timeouts.createSeconds");
    assert.ok(deadline.capped(30_000) <= 1000);
    assert.equal(deadline.capped(10), 10);
    assert.equal(new Deadline(0, "x").capped(5000), 1);
  });

  it("names the setting to raise in its timeout error", () => {
    const error = new Deadline(0, "timeouts.readySeconds").timeoutError("waiting for the agent");
    assert.ok(error instanceof TransientError);
    assert.match(
      error.message,
      /waiting for the agent did not finish within 0 s; raise timeouts\.readySeconds/,
    );
  });

  it("retries Transient failures until one succeeds", async () => {
    let attempts = 0;
    const result = await retryWithBackoff(
      "x",
      new Deadline(5000, "t"),
      { initialDelayMs: 5, maxDelayMs: 10 },
      async () => {
        attempts++;
        if (attempts < 3) throw new TransientError("busy");
        return "done";
      },
    );
    assert.deepEqual([result, attempts], ["done", 3]);
  });

  it("does not retry a Permanent failure", async () => {
    let attempts = 0;
    await assert.rejects(
      retryWithBackoff(
        "x",
        new Deadline(5000, "t"),
        { initialDelayMs: 5, maxDelayMs: 10 },
        async () => {
          attempts++;
          throw new PermanentError("denied");
        },
      ),
      /denied/,
    );
    assert.equal(attempts, 1);
  });

  it("gives up at the deadline with the last failure as the cause", async () => {
    await assert.rejects(
      retryWithBackoff(
        "the clone",
        new Deadline(100, "timeouts.createSeconds"),
        { initialDelayMs: 20, maxDelayMs: 40 },
        async () => {
          throw new TransientError("got timeout");
        },
      ),
      (error: unknown) =>
        error instanceof TransientError &&
        /the clone did not finish/.test(error.message) &&
        (error.cause as Error).message === "got timeout",
    );
  });

  it("readiness: returns once the port accepts, and times out on a closed port", async () => {
    const server = createServer((socket) => socket.end());
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
    const port = (server.address() as { port: number }).port;
    try {
      await waitForTcpPort("127.0.0.1", port, new Deadline(2000, "timeouts.readySeconds"), {
        pauseMs: 10,
      });
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
    await assert.rejects(
      waitForTcpPort("127.0.0.1", port, new Deadline(200, "timeouts.readySeconds"), {
        pauseMs: 20,
      }),
      /timeouts\.readySeconds/,
    );
  });

  it("readiness with authRequired: a package's default proxy (403) is not ready; the first 407 is, and no credentials are sent", async () => {
    const seen: IncomingMessage[] = [];
    // The package's own squid answers first; ours, asking for credentials, from the fourth request.
    let defaultAnswers = 3;
    const server = createHttpServer((request, response) => {
      seen.push(request);
      if (seen.length <= defaultAnswers)
        response.writeHead(403, { "x-squid-error": "ERR_ACCESS_DENIED 0" });
      else response.writeHead(407, { "proxy-authenticate": 'Basic realm="egress"' });
      response.end();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
    const port = (server.address() as { port: number }).port;
    try {
      await waitForProxyAuthRequired(
        "127.0.0.1",
        port,
        new Deadline(5000, "timeouts.readySeconds"),
        {
          pauseMs: 10,
        },
      );
      assert.equal(seen.length, 4);
      assert.ok(seen.every((request) => request.url === "http://readiness.invalid/"));
      assert.ok(seen.every((request) => request.headers["proxy-authorization"] === undefined));
      defaultAnswers = Infinity;
      await assert.rejects(
        waitForProxyAuthRequired("127.0.0.1", port, new Deadline(300, "timeouts.readySeconds"), {
          pauseMs: 20,
        }),
        /asking for credentials .*last answer: HTTP 403 \(ERR_ACCESS_DENIED 0\): squid refuses this machine.*gateway\.allowedClientCidrs.*timeouts\.readySeconds/,
      );
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
