'use strict'
// stockade from Node: run untrusted code confined, and gate an agent's tool calls.
//
//   const { run, runCode, Policy, Session, mark } = require('stockade')
//   const r = await runCode('console.log(6*7)', { language: 'javascript', timeoutMs: 2000 })
//   const d = Policy.fromFile('steward.toml', tools).authorize('send_raven', { to: 'eastwatch', text: '...' })
//   await Session.with({ memory: '256M' }, async (s) => (await s.exec(['echo', 'hi'])).stdout)
//
// Everything is stockade's own crates (stockade.node, napi-rs): this file only turns
// JavaScript values into JSON and refusals into typed errors. A refusal is never a value:
// a run resolves to a Verified or rejects with a Refusal (Timeout, OutputTooLarge,
// OutOfMemory, NonZeroExit, AssertionFailed, ...), which carries the run's report.

const fs = require('node:fs')
const path = require('node:path')
const native = require(process.env.STOCKADE_NODE_ADDON || path.join(__dirname, 'stockade.node'))

const helper = path.join(__dirname, 'stockade-process-helper')
if (!process.env.STOCKADE_HELPER && fs.existsSync(helper)) native.setHelper(helper)

/** A run's output is not trusted, or the run could not happen. */
class Refusal extends Error {
  constructor (message, report) {
    super(message)
    this.name = this.constructor.name
    this.kind = this.constructor.name
    this.report = report ?? null
  }
}

const errors = { Refusal }
for (const kind of native.refusalKinds()) {
  errors[kind] = { [kind]: class extends Refusal {} }[kind]
}

function refusal (kind, message, report) {
  const Cls = errors[kind] || Refusal
  return new Cls(message, report ? JSON.parse(report) : null)
}

// A synchronous call's refusal comes as an error whose message is the refusal as JSON.
function rethrown (err) {
  const m = /^stockade-refusal:(.*)$/s.exec(err && err.message)
  if (!m) return err
  const r = JSON.parse(m[1])
  return refusal(r.kind, r.message, r.report)
}

function sync (f) {
  try {
    return f()
  } catch (err) {
    throw rethrown(err)
  }
}

/** A verified run's value (read-only), with the run's report. */
class Verified {
  #value
  #report
  #reportJson
  constructor (value, reportJson) {
    this.#value = value
    this.#reportJson = reportJson
    Object.freeze(this)
  }

  get value () { return this.#value }
  /** The run's report (parsed on first use). */
  get report () {
    if (this.#report === undefined) this.#report = JSON.parse(this.#reportJson)
    return this.#report
  }
}

const TYPES = new Set(['string', 'number', 'integer', 'boolean', 'array', 'object'])

/** A host function grant: `fn(args)` runs only when the grant policy allows the call. It may be
 * `async`: the guest's call waits for its Promise, and Node's event loop goes on meanwhile. */
function fn (call, schema, description) {
  if (typeof call !== 'function') throw new errors.InvalidOptions('fn: a function')
  if (!schema || schema.type !== 'object') {
    throw new errors.InvalidOptions('fn: a JSON Schema object for the arguments ({type: "object", properties})')
  }
  for (const [k, v] of Object.entries(schema.properties || {})) {
    if (!TYPES.has(v.type)) throw new errors.InvalidOptions(`fn: argument ${k} needs a type`)
  }
  return { [GRANT]: true, call, schema, description }
}
const GRANT = Symbol('stockade.fn')

// The native options for `o`, on top of `extra`: each of `names` ([ours, native]) as given,
// each of `millis` from milliseconds to the native seconds.
function nativeOptions (o, names, millis, extra = {}) {
  const out = { ...extra }
  for (const [k, n] of names) if (o[k] !== undefined) out[n] = o[k]
  for (const [k, n] of millis) if (o[k] !== undefined) out[n] = o[k] / 1000
  return out
}

const RUN_NAMES = [['memory', 'memory'], ['maxOutput', 'max_output'], ['output', 'output'],
  ['expectExit', 'expect_exit'], ['env', 'env'], ['allowNet', 'allow_net'], ['netResolve', 'net_resolve'],
  ['strictGrants', 'strict_grants']]
const RUN_MILLIS = [['timeoutMs', 'timeout'], ['cpuMs', 'cpu']]
const SESSION_NAMES = [['memory', 'memory'], ['disk', 'disk'], ['env', 'env'], ['allowNet', 'allow_net'],
  ['netResolve', 'net_resolve']]
const SESSION_MILLIS = [['idleTimeoutMs', 'idle_timeout'], ['lifetimeMs', 'lifetime']]

function options (o, extra) {
  return nativeOptions(o, RUN_NAMES, RUN_MILLIS, extra)
}

// A host function's answer to the guest, as a Promise of JSON text: its value, awaited when
// it is a Promise (an `async` function), with `undefined` (no return value) answered as null.
// A throw or a rejection is the call's failure, which the guest sees as an error.
async function answer (call, argsJson) {
  const value = await call(JSON.parse(argsJson))
  return value === undefined ? 'null' : JSON.stringify(value)
}

// The native call's arguments for `o`: the options as JSON text (data grants in them), the
// guest's stdin, and the host functions (null when there are none). `sync`: the run holds
// Node's thread, where a host function would have to run, so none may be granted.
function prepare (opts, o, sync) {
  let grants = null
  const data = {}
  for (const [name, g] of Object.entries(o.grants || {})) {
    if (g && g[GRANT]) {
      if (sync) {
        throw new errors.InvalidOptions(`grants.${name}: a host function runs on Node's thread, which runSync holds; use run or runCode`)
      }
      grants ??= new native.Grants()
      grants.addFunction(name, JSON.stringify(g.schema), g.description ?? null,
        (argsJson) => answer(g.call, argsJson))
    } else if (typeof g === 'function') {
      throw new errors.InvalidOptions(`grants.${name}: wrap a function with fn(call, schema)`)
    } else {
      data[name] = g
    }
  }
  if (Object.keys(data).length) opts.data = data
  if (o.grantPolicy !== undefined) {
    opts.grant_policy = o.grantPolicy.includes('\n') ? o.grantPolicy : fs.readFileSync(o.grantPolicy, 'utf8')
  }
  const stdin = o.stdin === undefined ? null : Buffer.from(o.stdin)
  return [JSON.stringify(opts), stdin, grants]
}

// A run's native outcome as a Verified, or its refusal thrown.
function settle (out, o) {
  if (!out.ok) throw refusal(out.kind, out.message, out.report)
  const value = out.kind === 'json' ? JSON.parse(out.value) : out.kind === 'bytes' ? out.bytes : out.value
  if (o.check) {
    let verdict
    try {
      verdict = o.check(value)
    } catch (err) {
      throw new errors.AssertionFailed(`assertion failed: ${err && err.message}`, JSON.parse(out.report))
    }
    if (verdict === false) throw new errors.AssertionFailed('assertion failed: the check returned false', JSON.parse(out.report))
  }
  return new Verified(value, out.report)
}

async function execute (opts, o) {
  const [json, stdin, grants] = prepare(opts, o, false)
  return settle(await native.run(json, stdin, grants), o)
}

function executeSync (opts, o) {
  const [json, stdin] = prepare(opts, o, true)
  return settle(native.runSync(json, stdin), o)
}

/** Runs `argv` in the process tier: a Promise of a Verified, or a rejected Refusal. */
function run (argv, o = {}) {
  return execute(options(o, { argv }), o)
}

/** Runs `code`: javascript in the wasm tier, python and sh in the process tier. */
function runCode (code, o = {}) {
  return execute(options(o, { code, language: o.language ?? 'javascript' }), o)
}

/** `run`, on Node's own thread: a Verified, or a thrown Refusal. The event loop waits for
 * the run (as `execFileSync` makes it wait), so no host function (`fn`) can be granted. */
function runSync (argv, o = {}) {
  return executeSync(options(o, { argv }), o)
}

/** `runCode`, on Node's own thread (see `runSync`). */
function runCodeSync (code, o = {}) {
  return executeSync(options(o, { code, language: o.language ?? 'javascript' }), o)
}

/** One session exec: `exitCode` (null if killed), `signal`, `timedOut`, `stdout` and `stderr`
 * (Buffers, the guest's), and `report`. A non-zero exit is an answer, not a refusal. */
class ExecResult {
  constructor (summary, stdout, stderr) {
    this.exitCode = summary.exit_code
    this.signal = summary.signal
    this.timedOut = summary.timed_out
    this.stdout = stdout
    this.stderr = stderr
    this.report = summary.report
    Object.freeze(this)
  }
}

// A native call that answers a Promise: its value, or its refusal (thrown at once or as the
// rejection) as the typed error.
async function settled (call) {
  try {
    return await call()
  } catch (err) {
    throw rethrown(err)
  }
}

/** A confined sandbox that lives across execs (`stockade session`'s): `exec`, `write`, `read`,
 * `pause`, `resume`, `kill`, each a Promise. `Session.with(options, fn)` ends it when `fn`'s
 * Promise settles, also when it rejects. */
class Session {
  #native
  #killed = false
  constructor (nativeSession) {
    if (!(nativeSession instanceof native.Session)) throw new errors.InvalidOptions('Session: use Session.create(options)')
    this.#native = nativeSession
  }

  /** A new session: `memory`, `disk` (bytes or '256M'), `idleTimeoutMs`, `lifetimeMs`, `env`,
   * `allowNet`, `netResolve`. */
  static async create (o = {}) {
    const opts = nativeOptions(o, SESSION_NAMES, SESSION_MILLIS)
    return new Session(await settled(() => native.Session.create(JSON.stringify(opts))))
  }

  /** `fn(session)` in a new session, which is killed once `fn`'s Promise settles. */
  static async with (o, fn) {
    const s = await Session.create(o)
    try {
      return await fn(s)
    } finally {
      await s.kill()
    }
  }

  get id () { return this.#native.id }

  /** Runs `argv` in it: `stdin` (string or bytes), `timeoutMs` (default 60000), `cwd`. */
  async exec (argv, { stdin, timeoutMs, cwd } = {}) {
    const input = stdin === undefined ? null : Buffer.from(stdin)
    const timeout = timeoutMs === undefined ? null : timeoutMs / 1000
    const out = await settled(() => this.#native.exec(argv, input, timeout, cwd ?? null))
    return new ExecResult(JSON.parse(out.summary), out.stdout, out.stderr)
  }

  /** Writes `data` (string or bytes) to `path` (relative: in its home). */
  async write (path, data) { await settled(() => this.#native.write(path, Buffer.from(data))) }
  /** Reads `path` (relative: in its home): a Buffer. */
  async read (path) { return settled(() => this.#native.read(path)) }
  async pause () { await settled(() => this.#native.pause()) }
  async resume () { await settled(() => this.#native.resume()) }
  /** Ends it: everything it ran is gone, and its home removed, when this settles. Once. */
  async kill () {
    if (this.#killed) return
    this.#killed = true
    await settled(() => this.#native.kill())
  }
}
if (Symbol.asyncDispose) Session.prototype[Symbol.asyncDispose] = Session.prototype.kill

/** ALLOW: a policy (stockade's TOML) over the host's tools, one gate deciding each call. */
class Policy {
  #native
  constructor (nativePolicy) { this.#native = nativePolicy }

  static fromToml (text, tools) {
    return new Policy(sync(() => native.Policy.fromToml(text, JSON.stringify(tools))))
  }

  static fromFile (file, tools) {
    return Policy.fromToml(fs.readFileSync(file, 'utf8'), tools)
  }

  /** `{effect: 'allow', rule, permit}`, `{effect: 'ask', rule, reason}` or `{effect: 'deny', rule, reason}`. */
  authorize (tool, args, source = 'user') {
    return JSON.parse(sync(() => this.#native.authorize(tool, JSON.stringify(args), source)))
  }

  readUntrusted () { this.#native.setReadUntrusted() }
  get hasReadUntrusted () { return this.#native.hasReadUntrusted() }
  untrustedOutput (tool) { return this.#native.untrustedOutput(tool) }
}

/** MARK: untrusted text (or any JSON value) in a block no text inside can close. */
function mark (text, { source, callId = 'call', datamark = false } = {}) {
  if (typeof source !== 'string') throw new errors.InvalidOptions('mark: a source (the tool or origin)')
  const isJson = typeof text !== 'string'
  return JSON.parse(sync(() => native.mark(isJson ? JSON.stringify(text) : text, source, callId, isJson, datamark)))
}

/** The system-prompt sentence that tells the model what a marked block is. */
function systemPrompt ({ datamark = false } = {}) {
  return native.systemPrompt(datamark)
}

module.exports = { run, runCode, runSync, runCodeSync, fn, Policy, Session, ExecResult, mark, systemPrompt, Verified, ...errors }
