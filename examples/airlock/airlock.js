'use strict'
// airlock's `run(code, { grants })`, over stockade: the code runs in the wasm tier (QuickJS,
// fuel, memory and a deadline), data grants are its globals, and each call of a function
// grant runs on the host only when the grant policy allows that call. What the code prints
// as JSON is the result; anything else (a throw, a timeout, a flood) rejects with a typed
// stockade error.
//
//   const { run, fn } = require('./airlock')
//   await run('console.log(JSON.stringify(rows.map(r => price(r.sku))))',
//     { grants: { rows, price: fn(priceOf, schema) }, policy: 'prices.toml' })

// In a project of your own: require('stockade').
const { runCode, fn } = require('../../bindings/stockade-node')

/** Runs `code` with `grants`; resolves to the JSON value it printed. */
async function run (code, { grants = {}, policy, timeoutMs = 2000, memory = '64M' } = {}) {
  const r = await runCode(code, { language: 'javascript', grants, grantPolicy: policy, timeoutMs, memory, output: 'json' })
  return r.value
}

module.exports = { run, fn }
