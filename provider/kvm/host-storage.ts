/**
 * The host's storage as KvmProxy uses it: pools (find, define, start,
 * measure, refresh) and volumes (find, describe, create, upload, delete).
 */
import type { Readable } from "node:stream";
import { isTransient, PermanentError } from "../common/errors";
import {
  ErrorCode,
  Procedures,
  type StoragePoolHandle,
  type StorageVolHandle,
  type StorageVolInfo,
} from "../libvirt-rpc-xdr";
import { sharedPoolListing, sharedVolumeListing } from "./host-listings";
import { HostRpc, isLibvirtCode } from "./host-rpc";
import { parseVolumeXml, type VolumeDescription } from "./volume-xml";

export abstract class HostStorage extends HostRpc {
  /** The pool, or undefined when the host has no pool of that name. */
  async findPool(name: string): Promise<StoragePoolHandle | undefined> {
    try {
      return await this.call(Procedures.storagePoolLookupByName, { name });
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.NO_STORAGE_POOL)) return undefined;
      throw this.classify(error, "storagePoolLookupByName", `pool ${name}`);
    }
  }

  async pool(name: string): Promise<StoragePoolHandle> {
    const pool = await this.findPool(name);
    if (pool === undefined)
      throw new PermanentError(
        `storage pool ${JSON.stringify(name)} does not exist on ${this.label}; create it (virsh pool-define-as ${name} dir --target /var/lib/libvirt/images; virsh pool-build ${name}; virsh pool-start ${name}; virsh pool-autostart ${name}, or egress-proxies doctor --fix for the pool default) or set pool`,
      );
    return pool;
  }

  /** The pool's size and free space as libvirt last measured them (`virsh pool-info`). */
  async poolSpace(pool: StoragePoolHandle): Promise<{ capacity: bigint; available: bigint }> {
    const info = await this.rpc(Procedures.storagePoolGetInfo, { pool }, `pool ${pool.name}`);
    return { capacity: BigInt(info.capacity), available: BigInt(info.available) };
  }

  findVolume(pool: StoragePoolHandle, name: string): Promise<StorageVolHandle | undefined> {
    return this.orUndefined(() =>
      this.rpc(Procedures.storageVolLookupByName, { pool, name }, `volume ${name}`),
    );
  }

  /**
   * Whether the pool holds a volume of that name, from the host's shared
   * pool and volume listings (host-listings.ts): the same in-memory view of
   * the pool a look-up by name consults, asked once per window for all Reads.
   */
  async volumeListed(poolName: string, volumeName: string): Promise<boolean> {
    const pool = (await this.sharedOrOwn(sharedPoolListing, () => this.poolsByName())).get(
      poolName,
    );
    if (pool === undefined) return false;
    const names = await this.sharedOrOwn(
      (hostKey, list) => sharedVolumeListing(hostKey, poolName, list),
      () => this.volumeNames(pool),
    );
    return names.has(volumeName);
  }

  /** The host's pools (inactive ones too), by name. */
  async poolsByName(): Promise<ReadonlyMap<string, StoragePoolHandle>> {
    const pools = await this.listAll(
      Procedures.connectListAllStoragePools,
      0,
      "pools",
      (r) => r.pools,
    );
    return new Map(pools.map((pool) => [pool.name, pool]));
  }

  /** The names of the pool's volumes, as libvirt holds them. */
  async volumeNames(pool: StoragePoolHandle): Promise<ReadonlySet<string>> {
    const { vols } = await this.rpc(
      Procedures.storagePoolListAllVolumes,
      { pool, needResults: 1, flags: 0 },
      `pool ${pool.name}`,
    );
    return new Set(vols.map((vol) => vol.name));
  }

  /**
   * A volume's capacity by pool and name, without a look-up first (libvirt
   * finds a volume by its pool's and its own name); undefined when gone.
   */
  async volumeCapacityNamed(poolName: string, name: string): Promise<bigint | undefined> {
    const info = await this.orUndefined(() => this.volumeInfo({ pool: poolName, name, key: "" }));
    return info === undefined ? undefined : BigInt(info.capacity);
  }

  /** The host's shared listing when this host shares them, else its own answer. */
  protected sharedOrOwn<T>(
    shared: (hostKey: string, list: () => Promise<T>) => Promise<T>,
    own: () => Promise<T>,
  ): Promise<T> {
    return this.hostKey !== undefined ? shared(this.hostKey, own) : own();
  }

  volumeInfo(vol: StorageVolHandle): Promise<StorageVolInfo> {
    return this.rpc(Procedures.storageVolGetInfo, { vol }, `volume ${vol.name}`);
  }

  volumePath(vol: StorageVolHandle): Promise<string> {
    return this.rpc(Procedures.storageVolGetPath, { vol }, `volume ${vol.name}`);
  }

  /** Capacity and path in one call (the volume's XML). */
  async volumeDescription(vol: StorageVolHandle): Promise<VolumeDescription> {
    const xml = await this.rpc(
      Procedures.storageVolGetXmlDesc,
      { vol, flags: 0 },
      `volume ${vol.name}`,
    );
    try {
      return parseVolumeXml(xml);
    } catch (error) {
      throw new PermanentError(`volume ${vol.name} on ${this.label}: ${(error as Error).message}`, {
        cause: error,
      });
    }
  }

  /**
   * A volume's handle and description by pool and name, in one call instead
   * of a look-up and then GET_XML_DESC: libvirt finds a volume by its pool's
   * and its own name (the handle's key is not consulted), and answers
   * NO_STORAGE_VOL when there is none: undefined here.
   */
  async describeVolumeNamed(
    pool: StoragePoolHandle,
    name: string,
  ): Promise<{ volume: StorageVolHandle; description: VolumeDescription } | undefined> {
    const description = await this.orUndefined(() =>
      this.volumeDescription({ pool: pool.name, name, key: "" }),
    );
    if (description === undefined) return undefined;
    return { volume: { pool: pool.name, name, key: description.key }, description };
  }

  createVolume(pool: StoragePoolHandle, name: string, xml: string): Promise<StorageVolHandle> {
    return this.rpc(Procedures.storageVolCreateXml, { pool, xml, flags: 0 }, `volume ${name}`);
  }

  /**
   * Creates the volume, or returns undefined when one of that name exists:
   * one call where a look-up and a create were two.
   */
  async createVolumeIfAbsent(
    pool: StoragePoolHandle,
    name: string,
    xml: string,
  ): Promise<StorageVolHandle | undefined> {
    this.deadline.check(`libvirt storageVolCreateXml on ${this.label}`);
    try {
      return await this.call(Procedures.storageVolCreateXml, { pool, xml, flags: 0 });
    } catch (error) {
      if (isLibvirtCode(error, ErrorCode.STORAGE_VOL_EXIST)) return undefined;
      throw this.classify(error, "storageVolCreateXml", `volume ${name}`);
    }
  }

  /** Deleting what is already gone is fine: delete is idempotent. */
  async deleteVolume(vol: StorageVolHandle): Promise<void> {
    await this.orUndefined(() =>
      this.rpc(Procedures.storageVolDelete, { vol, flags: 0 }, `volume ${vol.name}`),
    );
  }

  async deleteVolumeNamed(pool: StoragePoolHandle, name: string): Promise<boolean> {
    const vol = await this.findVolume(pool, name);
    if (vol === undefined) return false;
    await this.deleteVolume(vol);
    return true;
  }

  async upload(vol: StorageVolHandle, source: Readable, length?: number): Promise<number> {
    this.deadline.check(`upload to ${vol.name} on ${this.label}`);
    try {
      const connection = await this.link();
      const { bytes } = await connection.upload({ vol, offset: 0, length: length ?? 0 }, source, {
        timeoutMs: this.deadline.remainingMs(),
      });
      return bytes;
    } catch (error) {
      throw this.classify(error, "storageVolUpload", `volume ${vol.name}`);
    } finally {
      this.forgetListings();
    }
  }

  /**
   * Makes libvirt re-read the pool (after an upload: the qcow2 virtual size).
   * libvirt refreshes in the background after an upload and refuses a second
   * refresh meanwhile ("asynchronous jobs running"), so that one is retried
   * (unless `once`: then that failure is thrown at once).
   */
  async refreshPool(pool: StoragePoolHandle, { once = false } = {}): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        await this.rpc(Procedures.storagePoolRefresh, { pool, flags: 0 }, `pool ${pool.name}`);
        return;
      } catch (error) {
        if (once || !isTransient(error) || this.deadline.remainingMs() < 1000) throw error;
        await new Promise((resolve) => setTimeout(resolve, Math.min(250 * attempt, 2000)));
      }
    }
  }

  /** Defines, builds (makes the directory), starts and autostarts a pool. */
  async definePool(name: string, xml: string): Promise<StoragePoolHandle> {
    const resource = `pool ${name}`;
    const pool = await this.rpc(Procedures.storagePoolDefineXml, { xml, flags: 0 }, resource);
    await this.rpc(Procedures.storagePoolBuild, { pool, flags: 0 }, resource);
    await this.startPool(pool);
    return pool;
  }

  /** Starts (unless it runs) and autostarts a pool. */
  async startPool(pool: StoragePoolHandle): Promise<void> {
    const resource = `pool ${pool.name}`;
    if (!(await this.rpc(Procedures.storagePoolIsActive, { pool }, resource)))
      await this.rpc(Procedures.storagePoolCreate, { pool, flags: 0 }, resource);
    await this.rpc(Procedures.storagePoolSetAutostart, { pool, autostart: 1 }, resource);
  }
}
