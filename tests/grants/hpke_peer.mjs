// The independent HPKE peer of tests/grants/test_hpke_node_interop.py: @hpke/core (DHKEM
// X25519 on Node's WebCrypto, HKDF-SHA256) + @hpke/chacha20poly1305, as an app would seal a
// grant (PROTOCOL.md §6): RFC 9180 base mode, single shot, empty aad, sealedKey = enc ‖ ct.
//
//   node hpke_peer.mjs <install dir of scripts/pds/install.sh>  <job.json  >answer.json
//
// stdin: {"jobs": [job, ...]}, every bytes field standard base64, info a UTF-8 string:
//   {"op": "open", "privateKey": <32 raw bytes>, "sealedKey": ..., "info": "..."}
//       -> {"key": ...} or {"error": "..."}
//   {"op": "seal", "publicKey": <32 raw bytes>, "key": ..., "info": "..."}
//       -> {"sealedKey": enc ‖ ct}
// stdout: {"results": [answer, ...], "versions": {"@hpke/core": ..., ...}, "node": ...}
import { createRequire } from "node:module";
import { join } from "node:path";

const installDir = process.argv[2];
if (!installDir) {
  console.error("usage: node hpke_peer.mjs <install dir of scripts/pds/install.sh>");
  process.exit(2);
}
// ESM ignores NODE_PATH: resolve the packages from the install dir's own node_modules.
const require = createRequire(join(installDir, "package.json"));
const { CipherSuite, DhkemX25519HkdfSha256, HkdfSha256 } = require("@hpke/core");
const { Chacha20Poly1305 } = require("@hpke/chacha20poly1305");

const suite = new CipherSuite({
  kem: new DhkemX25519HkdfSha256(),
  kdf: new HkdfSha256(),
  aead: new Chacha20Poly1305(),
});

const b64 = (s) => {
  const b = Buffer.from(s, "base64");
  return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
};
const toB64 = (buf) => Buffer.from(new Uint8Array(buf)).toString("base64");
const utf8 = (s) => new TextEncoder().encode(s);

async function open(job) {
  const recipientKey = await suite.kem.deserializePrivateKey(b64(job.privateKey));
  const sealed = new Uint8Array(b64(job.sealedKey));
  const enc = sealed.slice(0, suite.kem.encSize).buffer;
  const ct = sealed.slice(suite.kem.encSize).buffer;
  const pt = await suite.open({ recipientKey, enc, info: utf8(job.info) }, ct);
  return { key: toB64(pt) };
}

async function seal(job) {
  const recipientPublicKey = await suite.kem.deserializePublicKey(b64(job.publicKey));
  const { ct, enc } = await suite.seal({ recipientPublicKey, info: utf8(job.info) }, b64(job.key));
  const out = new Uint8Array(enc.byteLength + ct.byteLength);
  out.set(new Uint8Array(enc), 0);
  out.set(new Uint8Array(ct), enc.byteLength);
  return { sealedKey: toB64(out) };
}

const ops = { open, seal };
let input = "";
for await (const chunk of process.stdin) input += chunk;
const { jobs } = JSON.parse(input);
const results = [];
for (const job of jobs) {
  const op = ops[job.op];
  if (!op) {
    results.push({ error: `unknown op ${JSON.stringify(job.op)}` });
    continue;
  }
  try {
    results.push(await op(job));
  } catch (e) {
    results.push({ error: `${e?.name ?? "Error"}: ${e?.message ?? e}` });
  }
}
const versions = Object.fromEntries(
  ["@hpke/core", "@hpke/chacha20poly1305", "@hpke/common"].map((p) => [p, require(`${p}/package.json`).version]),
);
process.stdout.write(JSON.stringify({ results, versions, node: process.version }));
