'use strict'
// The Node package's side of `cargo xtask bench bindings`: a wasm runCode of console.log(1)
// and one authorize, N times each (after 20 unmeasured), as the Rust baseline makes them;
// prints each call's microseconds as JSON.
const assert = require('node:assert/strict')
const stockade = require('..')

const n = Number(process.argv[2] || 200)
const TOML = 'version = 1\ndefault = "deny"\n[[rule]]\nid = "allies"\ntool = "send_raven"\neffect = "allow"\nargs.to = { one_of = ["riverhold", "highcliff"] }\n'
const TOOLS = { send_raven: { type: 'object', properties: { to: { type: 'string' }, text: { type: 'string' } }, required: ['to', 'text'] } }

async function main () {
  const policy = stockade.Policy.fromToml(TOML, TOOLS)
  const args = { to: 'riverhold', text: 'all quiet' }
  const runUs = []
  const authorizeUs = []
  for (let i = 0; i < n + 20; i++) {
    let t = process.hrtime.bigint()
    const r = await stockade.runCode('console.log(1)', { language: 'javascript' })
    const took = Number(process.hrtime.bigint() - t) / 1e3
    assert.equal(r.value, '1\n')
    t = process.hrtime.bigint()
    const d = policy.authorize('send_raven', args)
    const tookAuth = Number(process.hrtime.bigint() - t) / 1e3
    assert.equal(d.effect, 'allow')
    if (i >= 20) { runUs.push(took); authorizeUs.push(tookAuth) }
  }
  console.log(JSON.stringify({ run_us: runUs, authorize_us: authorizeUs }))
}
main()
