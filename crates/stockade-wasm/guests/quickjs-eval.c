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
 * Nothing here is a security boundary: the wasm engine and the host's limits are. The
 * in-guest memory limit only turns a runaway allocation into a catchable InternalError
 * before the host's memory cap is reached. The std and os modules are not registered: the
 * script gets console.log/print, sleep(ms), and nothing that names a file, a process or a
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
    JS_FreeValue(ctx, global);
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
