#!/usr/bin/env node
// Start an in-memory PLC and one reference PDS (dev-env "TestNetworkNoAppView") on
// loopback for gelbridge development and tests. Nothing leaves the machine: no
// crawlers, no appview (*.invalid URLs), invites off, dev mode, PLC in memory,
// PDS SQLite + blobs under --data-dir (the caller deletes it).
//
// Usage: node start.js --install-dir DIR --pds-port N --plc-port M --data-dir DIR [--watch-stdin]
// Prints exactly one JSON line on stdout when ready:
//   {"pds": "http://localhost:<port>", "plc": "http://localhost:<port>"}
// Stops cleanly on SIGINT/SIGTERM (and, with --watch-stdin, when stdin closes, so an
// orphaned PDS does not outlive a crashed parent). Diagnostics go to stderr.
'use strict'
const net = require('node:net')
const path = require('node:path')
const fs = require('node:fs')
const { createRequire } = require('node:module')

function parseArgs(argv) {
  const out = { watchStdin: false }
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]
    if (a === '--watch-stdin') out.watchStdin = true
    else if (a.startsWith('--') && i + 1 < argv.length) out[a.slice(2)] = argv[++i]
    else throw new Error(`unknown argument ${a}`)
  }
  for (const k of ['install-dir', 'pds-port', 'plc-port', 'data-dir']) {
    if (!out[k]) throw new Error(`missing --${k}`)
  }
  return out
}

// Bind every server to 127.0.0.1: PDS and PLC call listen(port) without a host,
// which would otherwise listen on all interfaces.
const origListen = net.Server.prototype.listen
net.Server.prototype.listen = function (...args) {
  if ((typeof args[0] === 'number' || /^\d+$/.test(String(args[0]))) &&
      (args.length === 1 || typeof args[1] === 'function')) {
    args.splice(1, 0, '127.0.0.1')
  } else if (args[0] && typeof args[0] === 'object' && 'port' in args[0] && !args[0].host) {
    args[0] = { ...args[0], host: '127.0.0.1' }
  }
  return origListen.apply(this, args)
}

async function main() {
  const opts = parseArgs(process.argv.slice(2))
  const req = createRequire(path.join(path.resolve(opts['install-dir']), 'package.json'))
  const { TestNetworkNoAppView } = req('@atproto/dev-env')
  const dataDir = path.resolve(opts['data-dir'])
  fs.mkdirSync(path.join(dataDir, 'pds'), { recursive: true })
  fs.mkdirSync(path.join(dataDir, 'blobs'), { recursive: true })

  const network = await TestNetworkNoAppView.create({
    plc: { port: Number(opts['plc-port']) },
    pds: {
      port: Number(opts['pds-port']),
      dataDirectory: path.join(dataDir, 'pds'),
      blobstoreDiskLocation: path.join(dataDir, 'blobs'),
      inviteRequired: false,
      crawlers: [],
      devMode: true,
    },
  })
  const cfg = network.pds.ctx.cfg
  if (cfg.identity.plcUrl !== network.plc.url) throw new Error('PDS is not using the local PLC')
  if ((cfg.crawlers || []).length !== 0) throw new Error('PDS has crawlers configured')

  let closing = false
  const shutdown = async (why) => {
    if (closing) return
    closing = true
    process.stderr.write(`dev-pds: stopping (${why})\n`)
    const guard = setTimeout(() => process.exit(1), 10000)
    guard.unref()
    try {
      await network.close()
      process.exit(0)
    } catch (err) {
      process.stderr.write(`dev-pds: error while stopping: ${err && err.stack || err}\n`)
      process.exit(1)
    }
  }
  process.on('SIGINT', () => shutdown('SIGINT'))
  process.on('SIGTERM', () => shutdown('SIGTERM'))
  if (opts.watchStdin) {
    process.stdin.on('end', () => shutdown('stdin closed'))
    process.stdin.on('error', () => shutdown('stdin error'))
    process.stdin.resume()
  }
  process.stdout.write(JSON.stringify({ pds: network.pds.url, plc: network.plc.url }) + '\n')
}

main().catch((err) => {
  process.stderr.write(`dev-pds: failed to start: ${err && err.stack || err}\n`)
  process.exit(1)
})
