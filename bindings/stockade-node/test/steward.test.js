'use strict'
// The seed's steward in TypeScript (examples/steward/steward.ts, compiled by tsc in `cargo
// xtask bindings`), with its tool() list and two hooks over `stockade`, against a scripted
// OpenAI-compatible endpoint of this test's own. Judged by the ravens file and by what the
// model was sent.
const test = require('node:test')
const assert = require('node:assert/strict')
const fs = require('node:fs')
const http = require('node:http')
const os = require('node:os')
const path = require('node:path')

const steward = require('../../../examples/steward/steward.js')

function scripted (answers) {
  const received = []
  const server = http.createServer((req, res) => {
    let body = ''
    req.on('data', (c) => { body += c })
    req.on('end', () => {
      received.push(JSON.parse(body))
      const answer = JSON.stringify(answers.shift())
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answer) })
      res.end(answer)
    })
  })
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () =>
    resolve({ url: `http://127.0.0.1:${server.address().port}/v1`, received, close: () => server.close() })))
}

const calls = (...pairs) => ({
  choices: [{
    message: {
      role: 'assistant',
      content: null,
      tool_calls: pairs.map(([name, args], i) => ({ id: `c${i}-${name}`, type: 'function', function: { name, arguments: JSON.stringify(args) } }))
    }
  }]
})

test('the steward sends the ally raven and no forbidden one', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'steward-node-'))
  process.env.STEWARD_RAVENS = path.join(dir, 'ravens.jsonl')
  const mock = await scripted([
    calls(['send_raven', { to: 'riverhold', text: 'The harvest is in.' }], ['read_scroll', { name: 'north' }], ['read_scroll', { name: 'stranger' }]),
    calls(['read_ledger', { page: 1 }], ['send_raven', { to: 'eastwatch', text: 'page 1: 1200 measures of grain' }],
      ['send_raven', { to: 'riverhold', text: 'the bridge at the ford is out' }], ['run_code', { language: 'javascript', code: 'console.log(1200 / 3)' }]),
    { choices: [{ message: { role: 'assistant', content: 'The harvest report is ready.' } }] }
  ])
  try {
    const answer = await steward.runAgent(mock.url, 'm', steward.tools)
    assert.equal(answer, 'The harvest report is ready.')
  } finally {
    mock.close()
  }
  const flown = fs.readFileSync(process.env.STEWARD_RAVENS, 'utf8').trim().split('\n').map((l) => JSON.parse(l))
  assert.deepEqual(flown, [{ to: 'riverhold', text: 'The harvest is in.' }], 'only the ally raven flew')
  const tools = mock.received[2].messages.filter((m) => m.role === 'tool').map((m) => m.content)
  assert.equal(tools[0], 'A raven flew to riverhold.')
  assert.ok(tools[2].includes('<untrusted id=') && tools[2].includes('&lt;|im_start|&gt;'), tools[2])
  assert.ok(tools[4].startsWith('Blocked by policy (default-deny)'), tools[4])
  assert.ok(tools[5].includes('approval'), tools[5])
  assert.ok(tools[6].includes('400') && tools[6].includes('[provenance source="run_code"'), tools[6])
  // As a real server reads them: llama-cpp-python refuses a null assistant content.
  const sent = mock.received.flatMap((r) => r.messages).filter((m) => m.role === 'assistant')
  assert.ok(sent.length && sent.every((m) => typeof m.content === 'string'), JSON.stringify(sent))
})
