'use strict'
// The Node package's side of `cargo xtask bench bindings`: a wasm runCode of console.log(1)
// and one authorize, N times each (after 20 unmeasured), in the Rust baseline's pattern (a
// run, then a decision); then the same with runCodeSync on Node's thread; then Node's own
// floor for a native call settled as a Promise (fs.promises.access against fs.accessSync).
// Each in a loop of its own, since what runs between two calls changes how long a thread
// takes to wake on this VM. Prints each call's microseconds as JSON.
const assert = require('node:assert/strict')
const fs = require('node:fs')
const stockade = require('..')

const n = Number(process.argv[2] || 200)
const TOML = 'version = 1\ndefault = "deny"\n[[rule]]\nid = "allies"\ntool = "send_raven"\neffect = "allow"\nargs.to = { one_of = ["riverhold", "highcliff"] }\n'
const TOOLS = { send_raven: { type: 'object', properties: { to: { type: 'string' }, text: { type: 'string' } }, required: ['to', 'text'] } }

const micros = (t) => Number(process.hrtime.bigint() - t) / 1e3

// N timings of `call` (after 20 unmeasured), each followed by an authorize, also timed.
async function loop (call, policy) {
  const args = { to: 'riverhold', text: 'all quiet' }
  const callUs = []
  const authorizeUs = []
  for (let i = 0; i < n + 20; i++) {
    let t = process.hrtime.bigint()
    await call()
    const took = micros(t)
    t = process.hrtime.bigint()
    const d = policy.authorize('send_raven', args)
    const tookAuth = micros(t)
    assert.equal(d.effect, 'allow')
    if (i >= 20) { callUs.push(took); authorizeUs.push(tookAuth) }
  }
  return [callUs, authorizeUs]
}

async function main () {
  const policy = stockade.Policy.fromToml(TOML, TOOLS)
  const [runUs, authorizeUs] = await loop(async () => {
    const r = await stockade.runCode('console.log(1)', { language: 'javascript' })
    assert.equal(r.value, '1\n')
  }, policy)
  const [syncUs] = await loop(() => {
    assert.equal(stockade.runCodeSync('console.log(1)', { language: 'javascript' }).value, '1\n')
  }, policy)
  const [floorUs] = await loop(() => fs.promises.access('/'), policy)
  const [floorSyncUs] = await loop(() => fs.accessSync('/'), policy)
  console.log(JSON.stringify({ run_us: runUs, authorize_us: authorizeUs, sync_run_us: syncUs, floor_us: floorUs, floor_sync_us: floorSyncUs }))
}
main()
