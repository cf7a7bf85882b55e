/**
 * The provider closures releases up to 0.1.0 stored in every resource's state
 * (`__provider`), byte for byte as the closure serializer wrote them: seven
 * wrapper functions that call the implementation module's exports by name.
 * Existing stacks keep running this code at refresh and destroy until their
 * next update, so test/engine/frozen-api.test.ts evaluates it against the
 * packed package of today.
 */
export const STORED_PROVIDER_CLOSURES_0_1_0: Readonly<Record<string, string>> = {
  KvmProxy: `exports.handler = __f0;

var __provider = {configure: __f1, check: __f2, diff: __f3, create: __f4, read: __f5, update: __f6, delete: __f7};
const implementation = require("egress-proxies/dist/provider/kvm/provider.js");

function __f1(__0) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (request) => implementation.configure(request);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f2(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (olds, news) => implementation.check(olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f3(__0, __1, __2) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, olds, news) => implementation.diff(id, olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f4(__0) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (inputs) => implementation.create(inputs);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f5(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, props) => implementation.read(id, props);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f6(__0, __1, __2) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, olds, news) => implementation.update(id, olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f7(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return async (id, props) => {
        await implementation.remove(id, props);
    };

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f0() {
  return (function() {
    with({ provider: __provider, this: undefined, arguments: undefined }) {

return () => provider;

    }
  }).apply(undefined, undefined).apply(this, arguments);
}
`,
  ProxmoxProxy: `exports.handler = __f0;

var __provider = {configure: __f1, check: __f2, diff: __f3, create: __f4, read: __f5, update: __f6, delete: __f7};
const implementation = require("egress-proxies/dist/provider/proxmox/provider.js");

function __f1(__0) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (request) => implementation.configure(request);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f2(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (olds, news) => implementation.check(olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f3(__0, __1, __2) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, olds, news) => implementation.diff(id, olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f4(__0) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (inputs) => implementation.create(inputs);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f5(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, props) => implementation.read(id, props);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f6(__0, __1, __2) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, olds, news) => implementation.update(id, olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f7(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return async (id, props) => {
        await implementation.remove(id, props);
    };

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f0() {
  return (function() {
    with({ provider: __provider, this: undefined, arguments: undefined }) {

return () => provider;

    }
  }).apply(undefined, undefined).apply(this, arguments);
}
`,
  StaticProxy: `exports.handler = __f0;

var __provider = {check: __f1, diff: __f2, create: __f3, read: __f4, update: __f5, delete: __f6};
const implementation = require("egress-proxies/dist/provider/static/provider.js");

function __f1(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (olds, news) => implementation.check(olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f2(__0, __1, __2) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, olds, news) => implementation.diff(id, olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f3(__0) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (inputs) => implementation.create(inputs);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f4(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, props) => implementation.read(id, props);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f5(__0, __1, __2) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return (id, olds, news) => implementation.update(id, olds, news);

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f6(__0, __1) {
  return (function() {
    with({ this: undefined, arguments: undefined }) {

return async (id, props) => {
        await implementation.remove(id, props);
    };

    }
  }).apply(undefined, undefined).apply(this, arguments);
}

function __f0() {
  return (function() {
    with({ provider: __provider, this: undefined, arguments: undefined }) {

return () => provider;

    }
  }).apply(undefined, undefined).apply(this, arguments);
}
`,
};
