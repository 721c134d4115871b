'use strict'
// airlock's run(code, {grants}) (examples/airlock/airlock.js) with a data grant and a
// function grant, each call of which the grant policy decides.
const test = require('node:test')
const assert = require('node:assert/strict')

const { run, fn } = require('../../../examples/airlock/airlock.js')
const stockade = require('..')

const POLICY = 'version = 1\ndefault = "deny"\n[[rule]]\nid = "known-skus"\ntool = "price"\neffect = "allow"\nargs.sku = { maximum = 99 }\n'

test('airlock runs code with a data grant and a policed function grant', async () => {
  const looked = []
  const price = fn(({ sku }) => { looked.push(sku); return sku * 10 },
    { type: 'object', properties: { sku: { type: 'integer' } }, required: ['sku'] })
  const rows = [{ sku: 3 }, { sku: 7 }, { sku: 500 }]
  const code = `console.log(JSON.stringify(rows.map((r) => { try { return price(r.sku) } catch (e) { return 'denied' } })))`
  assert.deepEqual(await run(code, { grants: { rows, price }, policy: POLICY }), [30, 70, 'denied'])
  assert.deepEqual(looked, [3, 7], 'the denied call never reached the host')
  await assert.rejects(run('while (true) {}', { timeoutMs: 500 }), stockade.Refusal)
  await assert.rejects(run('console.log("not json")'), stockade.MalformedOutput)
})
