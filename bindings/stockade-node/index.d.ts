// Types of the `stockade` Node package (index.js over stockade.node). A test checks this
// file against the addon and index.js: every name declared here is exported, with its kind.

/** Where the arguments of a call came from. */
export type Source = 'user' | 'config' | 'sandbox' | `tool:${string}`

export interface RunOptions {
  /** The wall-clock deadline (default 10 000). */
  timeoutMs?: number
  /** The CPU-time limit (default: the deadline). */
  cpuMs?: number
  /** The memory limit: bytes, or '256M' (default '512M'). */
  memory?: number | string
  /** The stdout budget: bytes, or '64K' (default '1M'); more kills the run. */
  maxOutput?: number | string
  /** How stdout is read (default 'text'). */
  output?: 'text' | 'json' | 'bytes'
  /** The exit code to expect (0). */
  expectExit?: number
  env?: Record<string, string>
  /** Standard input (not for javascript, whose source it is). */
  stdin?: string | Uint8Array
  /** The network grant's `--allow-net` entries (process tier). */
  allowNet?: string[]
  netResolve?: string[]
  /** Data (any JSON value) or host functions (`fn`), by name. */
  grants?: Record<string, unknown | HostFunction>
  /** The grant policy: TOML text, or a path to a .toml file. */
  grantPolicy?: string
  /** Refuse the run if the policy denied any grant call. */
  strictGrants?: boolean
  /** May reject the value: return false or throw. */
  check?: (value: any) => boolean | void
}

export interface RunCodeOptions extends RunOptions {
  /** 'javascript' (the wasm tier, the default), 'python' or 'sh' (the process tier). */
  language?: 'javascript' | 'js' | 'python' | 'sh'
}

/** A verified run's value, read-only, with the run's report. */
export declare class Verified<T = string> {
  readonly value: T
  readonly report: Record<string, any>
}

export interface HostFunction {
  call: (args: Record<string, unknown>) => unknown
  schema: { type: 'object', properties?: Record<string, { type: string }>, required?: string[] }
  description?: string
}

export type Decision =
  | { effect: 'allow', rule: string, permit: { tool: string, args: Record<string, unknown>, rule: string } }
  | { effect: 'ask', rule: string, reason: string }
  | { effect: 'deny', rule: string, reason: string }

export interface Marked {
  /** The whole block: what goes into the prompt. */
  text: string
  header: string
  open: string
  body: string
  close: string
  nonce: string
}

export declare function run (argv: string[], options?: RunOptions): Promise<Verified<any>>
export declare function runCode (code: string, options?: RunCodeOptions): Promise<Verified<any>>
/** `run` on Node's own thread, which waits for it; no host function may be granted. */
export declare function runSync (argv: string[], options?: RunOptions): Verified<any>
/** `runCode` on Node's own thread, which waits for it; no host function may be granted. */
export declare function runCodeSync (code: string, options?: RunCodeOptions): Verified<any>
/** A host function grant; `call` may be `async` (its Promise is awaited, Node's loop going on). */
export declare function fn (call: (args: Record<string, any>) => unknown, schema: HostFunction['schema'],
  description?: string): HostFunction
export declare function mark (text: unknown, options: { source: string, callId?: string, datamark?: boolean }): Marked
export declare function systemPrompt (options?: { datamark?: boolean }): string

export declare class Policy {
  static fromToml (text: string, tools: Record<string, object>): Policy
  static fromFile (file: string, tools: Record<string, object>): Policy
  authorize (tool: string, args: Record<string, unknown>, source?: Source): Decision
  readUntrusted (): void
  readonly hasReadUntrusted: boolean
  untrustedOutput (tool: string): boolean
}

export interface SessionOptions {
  /** The memory limit of everything it runs: bytes, or '256M' (default '512M'). */
  memory?: number | string
  /** Its home's size: bytes, or '1G' (default: the state directory's filesystem). */
  disk?: number | string
  /** It ends after this long without an exec (default 300 000). */
  idleTimeoutMs?: number
  /** It ends after this long whatever it does (default 3 600 000). */
  lifetimeMs?: number
  env?: Record<string, string>
  /** The network grant's `--allow-net` entries. */
  allowNet?: string[]
  netResolve?: string[]
}

/** One session exec. A non-zero exit is an answer, not a refusal. */
export declare class ExecResult {
  /** null if it was killed by a signal or timed out. */
  readonly exitCode: number | null
  readonly signal: number | null
  readonly timedOut: boolean
  readonly stdout: Uint8Array // a Buffer
  readonly stderr: Uint8Array // a Buffer
  readonly report: Record<string, any>
}

/** A confined sandbox that lives across execs (`stockade session`'s). */
export declare class Session {
  static create (options?: SessionOptions): Promise<Session>
  /** `fn(session)` in a new session, killed once `fn`'s Promise settles (also on a rejection). */
  static with<T> (options: SessionOptions, fn: (session: Session) => Promise<T>): Promise<T>
  readonly id: string
  exec (argv: string[], options?: { stdin?: string | Uint8Array, timeoutMs?: number, cwd?: string }): Promise<ExecResult>
  write (path: string, data: string | Uint8Array): Promise<void>
  read (path: string): Promise<Uint8Array> // a Buffer
  pause (): Promise<void>
  resume (): Promise<void>
  /** Ends it: everything it ran is gone and its home removed when this settles. */
  kill (): Promise<void>
}

/** A run's output is not trusted, or the run could not happen. */
export declare class Refusal extends Error {
  readonly kind: string
  readonly report: Record<string, any> | null
}
export declare class InvalidOptions extends Refusal {}
export declare class Unsupported extends Refusal {}
export declare class FailedToStart extends Refusal {}
export declare class EnforcementMissing extends Refusal {}
export declare class Timeout extends Refusal {}
export declare class CpuLimit extends Refusal {}
export declare class OutOfMemory extends Refusal {}
export declare class OutputTooLarge extends Refusal {}
export declare class Killed extends Refusal {}
export declare class Trapped extends Refusal {}
export declare class NonZeroExit extends Refusal {}
export declare class MalformedOutput extends Refusal {}
export declare class AssertionFailed extends Refusal {}
export declare class GrantDenied extends Refusal {}
export declare class SandboxError extends Refusal {}
