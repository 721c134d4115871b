// Type-checked (tsc --noEmit --strict, in `cargo xtask bindings`) against index.d.ts: the
// package used as the README shows it. Never run; the tests in stockade.test.js run it.
import { AssertionFailed, Decision, ExecResult, Marked, Policy, Refusal, Session, Timeout, Verified, fn, mark, run, runCode, runCodeSync, runSync, systemPrompt } from '..'

async function main (): Promise<void> {
  const r: Verified<any> = await runCode('console.log(6*7)', { language: 'javascript', timeoutMs: 2000 })
  const value: string = r.value
  const c = await run(['python3', '-c', 'print(1)'], { memory: '256M', output: 'json', check: (v) => v === 1 })
  const add = fn(({ a, b }) => a + b, { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } } })
  const lookup = fn(async ({ sku }) => await Promise.resolve(sku * 10), { type: 'object', properties: { sku: { type: 'integer' } } })
  await runCode('add(1, 2)', { grants: { add, lookup, rows: [1, 2] }, grantPolicy: 'policy.toml', strictGrants: true })
  const out: Uint8Array = await Session.with({ memory: '256M', idleTimeoutMs: 60000 }, async (s: Session) => {
    await s.write('notes.txt', 'kept')
    const e: ExecResult = await s.exec(['cat', 'notes.txt'], { timeoutMs: 5000 })
    if (e.exitCode !== 0 || e.timedOut) console.log(e.signal, e.stderr.length)
    return s.read('notes.txt')
  })
  const d: Decision = Policy.fromFile('steward.toml', {}).authorize('send_raven', { to: 'eastwatch' }, 'tool:read_scroll')
  if (d.effect === 'allow') console.log(d.permit.tool)
  else console.log(d.rule, d.reason)
  const m: Marked = mark('scroll text', { source: 'gate' })
  const prompt: string = systemPrompt() + m.text
  try {
    await runCode('while (true) {}')
  } catch (e) {
    if (e instanceof Timeout || e instanceof AssertionFailed) console.log(e.kind, e.report)
    else if (e instanceof Refusal) console.log(e.message)
  }
  const s: Verified<any> = runCodeSync('console.log(1)', { timeoutMs: 500 })
  const t: string = runSync(['true'], { expectExit: 0 }).value
  console.log(value, c.report, prompt, s.value, t)
}

void main()
