// The few Node APIs steward.ts uses, declared here because Debian ships TypeScript without
// @types/node (and npm's registry is out of reach); a project with @types/node drops this file.
declare module 'fs' {
  export function readFileSync (file: string, encoding: 'utf8'): string
  export function appendFileSync (file: string, data: string): void
}
declare module 'path' {
  export function join (...parts: string[]): string
}
declare const __dirname: string
declare const require: { main: unknown }
declare const module: unknown
declare const process: { env: Record<string, string | undefined>, argv: string[], exitCode?: number }
declare function fetch (url: string, init: object): Promise<{ json (): Promise<any> }>
