// Type declarations for the two node-redlock versions, installed under npm aliases: 4.x ships no types, and
// 5.0.0-beta.2's types do not resolve under NodeNext (node-redlock #301). Only what the benchmark calls is declared.

declare module 'redlock4' {
  import { EventEmitter } from 'node:events';
  namespace Redlock {
    interface Lock {
      unlock(): Promise<void>;
    }
    interface Options {
      driftFactor?: number;
      retryCount?: number;
      retryDelay?: number;
      retryJitter?: number;
    }
  }
  class Redlock extends EventEmitter {
    constructor(clients: readonly unknown[], options?: Redlock.Options);
    lock(resource: string, ttl: number): Promise<Redlock.Lock>;
  }
  export = Redlock;
}

declare module 'redlock5' {
  import { EventEmitter } from 'node:events';
  export interface Settings {
    driftFactor?: number;
    retryCount?: number;
    retryDelay?: number;
    retryJitter?: number;
    automaticExtensionThreshold?: number;
  }
  export interface Lock {
    release(): Promise<unknown>;
  }
  export default class Redlock extends EventEmitter {
    constructor(clients: Iterable<unknown>, settings?: Settings);
    acquire(resources: string[], duration: number, settings?: Settings): Promise<Lock>;
  }
}
