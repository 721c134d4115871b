/*
 * stockade's JavaScript guest: QuickJS-ng as a WASI reactor that evaluates the script it
 * reads from stdin.
 *
 * Built by `cargo xtask guests` with Debian's clang for wasm32-wasi, from the QuickJS-ng
 * sources that the crates.io crate rquickjs-sys 0.14.0 ships. The engine is compiled into
 * this translation unit (quickjs.c is included) because run() reseeds the context's PRNG,
 * an internal field.
 *
 * Exports:
 *   wizer-initialize   builds the runtime and context once; the host snapshots the result
 *                      (wasmtime-wizer), so each run starts from a ready engine.
 *   run() -> i32       reads JavaScript from stdin, evaluates it as a global script named
 *                      <agent>, drains pending jobs, and returns the exit code: 0, or 1 after
 *                      printing an uncaught exception to stderr.
 *
 * Grants: before the script, run() asks the host for the run's manifest of grants through
 * the `host.call` import (stockade-wasm's HostCalls ABI, carrying stockade-protocol's broker
 * frames). Each data grant becomes a global holding its value; each function grant a global
 * function that calls the host, so `add(rows.length, 1)` works; `stockade.call(name, args)`
 * calls any grant by name. A network grant adds `fetch(url, init)` (a Promise of a Response
 * with status, ok, headers.get, text(), json(), arrayBuffer()): one host call, which the host
 * makes through the run's policed proxy; a refusal rejects with a TypeError. Each
 * `--net-secret`'s placeholder is `stockade.secrets.ENVVAR`. A run without
 * grants gets -1 from the host and no globals.
 *
 * Nothing here is a security boundary: the wasm engine and the host's limits are, and the
 * host checks every call it receives against the run's policy. The in-guest memory limit
 * only turns a runaway allocation into a catchable InternalError before the host's memory
 * cap is reached. The std and os modules are not registered: the script gets
 * console.log/print, sleep(ms), its grants, and nothing that names a file, a process or a
 * socket.
 */
#include "quickjs.c"
#include "quickjs-libc.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Largest script accepted on stdin: the host bounds stdin too, this only bounds the buffer. */
#define MAX_SOURCE (16u << 20)

static JSRuntime *rt;
static JSContext *ctx;

/* sleep(ms): blocks in the host (WASI poll_oneoff), which is what a deadline must be able
 * to cut. Harmless: it grants time, not access. */
static JSValue js_sleep(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv)
{
    int64_t ms;
    if (JS_ToInt64(c, &ms, argv[0]))
        return JS_EXCEPTION;
    if (ms > 0) {
        struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };
        nanosleep(&ts, NULL);
    }
    return JS_UNDEFINED;
}

__attribute__((import_module("host"), import_name("call")))
int32_t host_call(const char *req, int32_t req_len, char *resp, int32_t resp_cap);
__attribute__((import_module("host"), import_name("reply")))
int32_t host_reply(char *resp, int32_t cap);

static char reply_buf[64 << 10];

/* __stockade_raw(frameJson) -> replyJson, or null when the run has no grants. */
static JSValue js_stockade_raw(JSContext *c, JSValueConst this_val, int argc, JSValueConst *argv)
{
    size_t len;
    const char *req = JS_ToCStringLen(c, &len, argv[0]);
    if (!req)
        return JS_EXCEPTION;
    int32_t n = len > INT32_MAX ? -4 : host_call(req, (int32_t)len, reply_buf, (int32_t)sizeof reply_buf);
    JS_FreeCString(c, req);
    if (n == -1)
        return JS_NULL;
    if (n < 0)
        return JS_ThrowInternalError(c, "stockade: the grants broker refused the call (%d): see the run's report", (int)n);
    if ((size_t)n <= sizeof reply_buf)
        return JS_NewStringLen(c, reply_buf, (size_t)n);
    char *big = malloc((size_t)n);
    if (!big)
        return JS_ThrowOutOfMemory(c);
    int32_t got = host_reply(big, n);
    JSValue s = got == n ? JS_NewStringLen(c, big, (size_t)n) : JS_ThrowInternalError(c, "stockade: reply lost");
    free(big);
    return s;
}

/* Turns the manifest into globals. Positional arguments bind to a function's `params` (its
 * schema's `required` list); a single plain object is the arguments object itself. A name
 * with a dot (a host MCP server's `NAME.TOOL`) is also reachable as `NAME.TOOL(...)`, through
 * an object `NAME` made for it when no global of that name exists. It is
 * compiled once, in wizer-initialize, so that a run pays only for the call (one host call,
 * answered -1, when the run has no grants). */
static const char bootstrap[] =
    "globalThis.__stockade_boot = function () {\n"
    "  delete globalThis.__stockade_boot;\n"
    "  const raw = globalThis.__stockade_raw;\n"
    "  delete globalThis.__stockade_raw;\n"
    "  let next = 0;\n"
    "  const send = (grant, args) => raw(JSON.stringify({ type: 'call', id: ++next, grant, args }));\n"
    "  const first = send('stockade.list', {});\n"
    "  if (first === null) return;\n"
    "  const manifest = JSON.parse(first).result;\n"
    "  function call(grant, args) {\n"
    "    const r = JSON.parse(send(String(grant), args === undefined ? {} : args));\n"
    "    if (r.error) {\n"
    "      const e = new Error(grant + ': ' + r.error.code + ': ' + r.error.message);\n"
    "      e.code = r.error.code;\n"
    "      throw e;\n"
    "    }\n"
    "    return r.result;\n"
    "  }\n"
    "  const plain = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);\n"
    "  for (const [name, value] of Object.entries(manifest.data)) globalThis[name] = value;\n"
    "  const spaces = new Set();\n"
    "  for (const f of manifest.functions.filter((f) => f.name !== 'fetch')) {\n"
    "    const fn = globalThis[f.name] = function (...a) {\n"
    "      if (a.length === 0) return call(f.name, {});\n"
    "      if (a.length === 1 && plain(a[0])) return call(f.name, a[0]);\n"
    "      const args = {};\n"
    "      a.forEach((v, i) => { if (i < f.params.length) args[f.params[i]] = v; });\n"
    "      if (a.length > f.params.length) throw new TypeError(f.name + ' takes ' + f.params.length + ' positional arguments');\n"
    "      return call(f.name, args);\n"
    "    };\n"
    "    const dot = f.name.indexOf('.');\n"
    "    if (dot > 0) {\n"
    "      const ns = f.name.slice(0, dot);\n"
    "      if (!(ns in globalThis)) { globalThis[ns] = {}; spaces.add(ns); }\n"
    "      if (spaces.has(ns)) globalThis[ns][f.name.slice(dot + 1)] = fn;\n"
    "    }\n"
    "  }\n"
    "  if (manifest.functions.some((f) => f.name === 'fetch')) {\n"
    "    class Headers {\n"
    "      constructor(pairs) { this._p = (pairs || []).map(([k, v]) => [String(k).toLowerCase(), String(v)]); }\n"
    "      get(k) { const f = this._p.filter(([n]) => n === String(k).toLowerCase()).map(([, v]) => v); return f.length ? f.join(', ') : null; }\n"
    "      has(k) { return this.get(k) !== null; }\n"
    "      forEach(cb) { this._p.forEach(([k, v]) => cb(v, k, this)); }\n"
    "      entries() { return this._p[Symbol.iterator](); }\n"
    "      [Symbol.iterator]() { return this._p[Symbol.iterator](); }\n"
    "    }\n"
    "    const b64 = (s) => { const t = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'; const o = []; let n = 0, b = 0;\n"
    "      for (const c of s) { if (c === '=') break; n = (n << 6) | t.indexOf(c); b += 6; if (b >= 8) { b -= 8; o.push((n >> b) & 255); } } return new Uint8Array(o); };\n"
    "    class Response {\n"
    "      constructor(r, url) { this.status = r.status; this.statusText = r.statusText; this.ok = r.status >= 200 && r.status < 300;\n"
    "        this.headers = new Headers(r.headers); this.url = url; this._r = r; this.bodyUsed = false; }\n"
    "      _take() { if (this.bodyUsed) throw new TypeError('the body was already read'); this.bodyUsed = true; return this._r; }\n"
    "      async text() { const r = this._take(); if (r.body !== undefined) return r.body; let s = ''; for (const b of b64(r.body_base64)) s += String.fromCharCode(b); return s; }\n"
    "      async json() { return JSON.parse(await this.text()); }\n"
    "      async arrayBuffer() { const r = this._take(); return (r.body !== undefined ? new Uint8Array([...unescape(encodeURIComponent(r.body))].map((c) => c.charCodeAt(0))) : b64(r.body_base64)).buffer; }\n"
    "    }\n"
    "    globalThis.Headers = Headers;\n"
    "    globalThis.Response = Response;\n"
    "    globalThis.fetch = async function (input, init) {\n"
    "      const url = typeof input === 'object' && input !== null && 'url' in input ? String(input.url) : String(input);\n"
    "      const i = init || {};\n"
    "      let headers = i.headers;\n"
    "      if (headers instanceof Headers) headers = [...headers];\n"
    "      if (i.body !== undefined && i.body !== null && typeof i.body !== 'string') throw new TypeError('fetch: the body is a string');\n"
    "      let r;\n"
    "      try { r = call('fetch', { url, init: { method: i.method, headers, body: i.body } }); }\n"
    "      catch (e) { const t = new TypeError('fetch ' + url + ': ' + e.message); t.code = e.code; throw t; }\n"
    "      return new Response(r, url);\n"
    "    };\n"
    "  }\n"
    "  globalThis.stockade = Object.freeze({ call, manifest, secrets: Object.freeze(manifest.secrets || {}) });\n"
    "};\n";

static int setup(void)
{
    if (ctx)
        return 0;
    rt = JS_NewRuntime();
    if (!rt)
        return -1;
    /* Defense in depth under the host's linear-memory cap; the host cap is the limit. */
    JS_SetMemoryLimit(rt, (size_t)1 << 30);
    JS_SetMaxStackSize(rt, 256 << 10);
    js_std_init_handlers(rt);
    /* An unhandled rejection is an uncaught error: js_std_loop prints it and exits 1. */
    JS_SetHostPromiseRejectionTracker(rt, js_std_promise_rejection_tracker, NULL);
    ctx = JS_NewContext(rt);
    if (!ctx)
        return -1;
    js_std_add_helpers(ctx, 0, NULL);
    JSValue global = JS_GetGlobalObject(ctx);
    JS_SetPropertyStr(ctx, global, "sleep", JS_NewCFunction(ctx, js_sleep, "sleep", 1));
    JS_SetPropertyStr(ctx, global, "__stockade_raw", JS_NewCFunction(ctx, js_stockade_raw, "__stockade_raw", 1));
    JS_FreeValue(ctx, global);
    JSValue boot = JS_Eval(ctx, bootstrap, sizeof bootstrap - 1, "<stockade>", JS_EVAL_TYPE_GLOBAL);
    int failed = JS_IsException(boot);
    JS_FreeValue(ctx, boot);
    if (failed)
        return -1;
    return 0;
}

__attribute__((export_name("wizer-initialize")))
void wizer_initialize(void)
{
    setup();
}

static char *read_stdin(size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_SOURCE) {
                free(buf);
                return NULL;
            }
            cap *= 2;
            char *grown = realloc(buf, cap + 1);
            if (!grown) {
                free(buf);
                return NULL;
            }
            buf = grown;
        }
        ssize_t r = read(0, buf + n, cap - n);
        if (r < 0) {
            free(buf);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

__attribute__((export_name("run")))
int run(void)
{
    if (setup() != 0) {
        fputs("stockade-js: cannot create the engine\n", stderr);
        return 70;
    }
    /* A snapshot freezes the PRNG: reseed Math.random from the host's entropy each run. */
    uint64_t seed = 0;
    if (getentropy(&seed, sizeof seed) != 0 || seed == 0)
        seed = 0x9e3779b97f4a7c15ull;
    ctx->random_state = seed;

    size_t len = 0;
    char *src = read_stdin(&len);
    if (!src) {
        fputs("stockade-js: cannot read the script from stdin\n", stderr);
        return 70;
    }
    int code = 0;
    JSValue global = JS_GetGlobalObject(ctx);
    JSValue bootfn = JS_GetPropertyStr(ctx, global, "__stockade_boot");
    JSValue boot = JS_Call(ctx, bootfn, global, 0, NULL);
    JS_FreeValue(ctx, bootfn);
    JS_FreeValue(ctx, global);
    if (JS_IsException(boot)) {
        js_std_dump_error(ctx);
        JS_FreeValue(ctx, boot);
        free(src);
        fflush(stderr);
        return 1;
    }
    JS_FreeValue(ctx, boot);
    JSValue val = JS_Eval(ctx, src, len, "<agent>", JS_EVAL_TYPE_GLOBAL);
    free(src);
    if (JS_IsException(val)) {
        js_std_dump_error(ctx);
        code = 1;
    } else if (js_std_loop(ctx) != 0) {
        js_std_dump_error(ctx);
        code = 1;
    }
    JS_FreeValue(ctx, val);
    fflush(stdout);
    fflush(stderr);
    return code;
}
