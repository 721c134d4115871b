/*
 * The pre-initializer attack for the wasm tier (bounded, issue 39, finding 1): a module whose
 * `wizer-initialize` export, which the tier runs when it loads the module (before `_start`),
 * grows the guest's memory until refused, touching every page, then sleeps in the host for
 * 30 s. Before the fix it ran under no job limit: 4.2 GB of host memory under a 64 MiB job,
 * and a sleep that outlived a 1 s deadline by minutes. Built by `cargo xtask escape` beside
 * attacks.wasm; the harness judges from the host (the run's wall time, the cache's largest
 * artifact), never from this program.
 */
#include <stdio.h>
#include <time.h>

__attribute__((export_name("wizer-initialize"))) void preinit(void) {
    /* 1 MiB (16 pages) at a time, straight from the engine, until it says no. */
    for (;;) {
        long base = (long)__builtin_wasm_memory_grow(0, 16);
        if (base < 0) break;
        /* One byte a host page: every page is backed, and little fuel is spent. */
        for (long at = base * 65536; at < (base + 16) * 65536; at += 4096) ((volatile char *)0)[at] = 'A';
    }
    struct timespec ts = {30, 0};
    nanosleep(&ts, NULL);
}

int main(void) {
    puts("ATTEMPT main_after_initializer ok");
    return 0;
}
