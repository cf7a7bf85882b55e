/**
 * A plain call waiting for its REPLY: decodes the result, or the daemon's
 * error, and hands the outcome to the call's settle function once.
 */
import type { Packet, SerialHandler } from "./core";
import { LibvirtTransportError } from "./errors";
import { decodeLibvirtError, MessageStatus, type Procedure } from "./protocol";
import { XdrReader } from "./xdr";

export type CallOutcome<Ret> = { ok: true; value: Ret } | { ok: false; error: Error };

export /** A plain call waiting for its REPLY. */
class PendingCall<Ret> implements SerialHandler {
  constructor(
    private readonly procedure: Procedure<unknown, Ret>,
    private readonly settle: (outcome: CallOutcome<Ret>) => void,
  ) {}

  onReply(packet: Packet): void {
    if (packet.header.status === MessageStatus.OK) {
      try {
        const reader = new XdrReader(packet.body);
        const value = this.procedure.decodeRet(reader);
        reader.expectEnd(`libvirt ${this.procedure.name} reply`);
        this.settle({ ok: true, value });
      } catch (cause) {
        this.settle({
          ok: false,
          error: new LibvirtTransportError(
            "protocol",
            `undecodable reply to libvirt ${this.procedure.name}`,
            {
              cause,
            },
          ),
        });
      }
    } else {
      this.settle({ ok: false, error: decodeLibvirtError(this.procedure.name, packet.body) });
    }
  }

  onStream(): void {
    // A plain call never has stream packets; ignore rather than kill the link.
  }

  onConnectionLost(error: LibvirtTransportError): void {
    this.settle({ ok: false, error });
  }
}
