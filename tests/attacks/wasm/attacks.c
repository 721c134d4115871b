/*
 * The escape suite's attacks for the wasm tier: one WASI program, built by
 * `cargo xtask escape` with Debian's clang for wasm32-wasi. argv[1] names the attack (the
 * same names as the native programs in ../src/bin); the rest are the harness's key=value
 * targets (home=, shadow=, tcp=, pid=, marker=, ...).
 *
 * Like the native programs, it prints `ATTEMPT <what> <ok|ERRNO>` lines, which are evidence
 * only: the host judges from the world (canaries, listeners, files, processes). Whatever it
 * manages to read is printed, so a leaked canary shows up in the output.
 *
 * Attacks with no WASI counterpart (no process creation, no signals, no raw syscalls, no
 * sockets to create) are marked not applicable in the harness, with the reason.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <stdint.h>
#include <unistd.h>
#include <wasi/api.h>

extern char **environ;

static int g_argc;
static char **g_argv;

static const char *arg(const char *key)
{
    size_t n = strlen(key);
    for (int i = 2; i < g_argc; i++)
        if (strncmp(g_argv[i], key, n) == 0 && g_argv[i][n] == '=')
            return g_argv[i] + n + 1;
    return "";
}

static const char *errno_name(int e)
{
    switch (e) {
    case ENOTCAPABLE: return "ENOTCAPABLE";
    case EPERM: return "EPERM";
    case EACCES: return "EACCES";
    case EBADF: return "EBADF";
    case ENOENT: return "ENOENT";
    case EROFS: return "EROFS";
    case ENOTSUP: return "ENOTSUP";
    case ENOTSOCK: return "ENOTSOCK";
    case ENOSYS: return "ENOSYS";
    case EMFILE: return "EMFILE";
    case ENOMEM: return "ENOMEM";
    case EINVAL: return "EINVAL";
    case EISDIR: return "EISDIR";
    default: return "ERRNO";
    }
}

static void attempt(const char *what, int ok)
{
    if (ok)
        printf("ATTEMPT %s ok\n", what);
    else
        printf("ATTEMPT %s %s\n", what, errno_name(errno));
    fflush(stdout);
}

static void read_and_show(const char *what, const char *path)
{
    char buf[4096];
    int fd = open(path, O_RDONLY);
    attempt(what, fd >= 0);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n > 0) {
        buf[n] = 0;
        printf("READ %s: %s\n", what, buf);
    }
    close(fd);
}

static void write_to(const char *what, const char *path, int flags)
{
    int fd = open(path, O_WRONLY | flags, 0644);
    int ok = fd >= 0 && write(fd, "pwned\n", 6) == 6;
    attempt(what, ok);
    if (fd >= 0)
        close(fd);
}

static void path_join(char *out, size_t cap, const char *a, const char *b)
{
    snprintf(out, cap, "%s/%s", a, b);
}

static int fs_read_home_secrets(void)
{
    const char *files[] = { ".ssh/id_rsa", ".aws/credentials", ".config/gh/hosts.yml" };
    char p[1024];
    for (int i = 0; i < 3; i++) {
        path_join(p, sizeof p, arg("home"), files[i]);
        read_and_show(files[i], p);
        /* The same file through the workspace preopen and `..`. */
        snprintf(p, sizeof p, "/workspace/../../../../../..%s/%s", arg("home"), files[i]);
        read_and_show("dotdot", p);
    }
    return 0;
}

static int fs_read_shadow(void)
{
    read_and_show("shadow", arg("shadow"));
    read_and_show("etc_shadow", "/etc/shadow");
    read_and_show("etc_passwd", "/etc/passwd");
    return 0;
}

static int fs_write_outside(void)
{
    char p[1024];
    path_join(p, sizeof p, arg("home"), "pwned");
    write_to("create_home", p, O_CREAT | O_TRUNC);
    path_join(p, sizeof p, arg("home"), ".bashrc");
    write_to("append_bashrc", p, O_APPEND);
    write_to("create_tmp", "/tmp/pwned", O_CREAT);
    write_to("create_workspace", "/workspace/pwned", O_CREAT);
    return 0;
}

static int fs_symlink_out(void)
{
    char p[1024];
    path_join(p, sizeof p, arg("home"), ".ssh/id_rsa");
    attempt("symlink_abs", symlink(p, "/workspace/link") == 0);
    read_and_show("via_link", "/workspace/link");
    attempt("symlink_dotdot", symlink("../../../../..", "/workspace/up") == 0);
    snprintf(p, sizeof p, "/workspace/up%s/.ssh/id_rsa", arg("home"));
    read_and_show("via_up", p);
    return 0;
}

static int fs_truncate_readonly(void)
{
    /* The harness's read-only workspace holds this very module. */
    write_to("truncate_module", "/workspace/attacks.wasm", O_TRUNC);
    attempt("unlink_module", unlink("/workspace/attacks.wasm") == 0);
    return 0;
}

static int fs_proc_environ(void)
{
    char p[256];
    read_and_show("self_environ", "/proc/self/environ");
    read_and_show("init_environ", "/proc/1/environ");
    snprintf(p, sizeof p, "/proc/%s/environ", arg("pid"));
    read_and_show("victim_environ", p);
    return 0;
}

static int fs_kernel_knobs(void)
{
    write_to("core_pattern", "/proc/sys/kernel/core_pattern", O_TRUNC);
    write_to("hostname", "/proc/sys/kernel/hostname", O_TRUNC);
    return 0;
}

static int fs_cgroupfs(void)
{
    char p[512];
    snprintf(p, sizeof p, "/sys/fs/cgroup/pids/%s", arg("marker"));
    attempt("mkdir_cgroup", mkdir(p, 0755) == 0);
    return 0;
}

static int fs_special_files(void)
{
    const char *devs[] = { "/dev/mem", "/dev/kmsg", "/dev/tty", "/dev/sda" };
    for (int i = 0; i < 4; i++)
        read_and_show(devs[i], devs[i]);
    return 0;
}

static int fs_host_layout(void)
{
    const char *dirs[] = { "/", "/home", "/root", "/workspace/..", "/workspace" };
    for (int i = 0; i < 5; i++) {
        DIR *d = opendir(dirs[i]);
        attempt(dirs[i], d != NULL);
        if (!d)
            continue;
        struct dirent *e;
        while ((e = readdir(d)))
            printf("ENTRY %s/%s\n", dirs[i], e->d_name);
        closedir(d);
    }
    return 0;
}

static int fs_disk_fill(void)
{
    /* The workspace is read-only and there is no other writable place. */
    static char block[1 << 16];
    int fd = open("/workspace/fill", O_WRONLY | O_CREAT, 0644);
    attempt("open_fill", fd >= 0);
    if (fd >= 0)
        for (;;)
            if (write(fd, block, sizeof block) <= 0)
                break;
    return 0;
}

static int env_inherited_secret(void)
{
    int n = 0;
    for (char **e = environ; e && *e; e++, n++)
        printf("ENV %s\n", *e);
    errno = ENOENT;
    attempt("environment_nonempty", n > 0);
    return 0;
}

/* No socket can be created in WASI preview 1; the only socket calls work on descriptors
 * the host preopened. Try them on every descriptor a guest could guess. */
static int net_any(void)
{
    char msg[] = "pwned";
    __wasi_ciovec_t iov = { (const uint8_t *)msg, sizeof msg };
    int sent = 0, accepted = 0, send_err = 0, accept_err = 0;
    for (int fd = 0; fd < 64; fd++) {
        __wasi_size_t n = 0;
        __wasi_errno_t e = __wasi_sock_send(fd, &iov, 1, 0, &n);
        if (e == 0 && n > 0)
            sent++;
        else
            send_err = e;
        __wasi_fd_t conn;
        e = __wasi_sock_accept(fd, 0, &conn);
        if (e == 0)
            accepted++;
        else
            accept_err = e;
    }
    errno = send_err;
    attempt("sock_send_any_fd", sent > 0);
    errno = accept_err;
    attempt("sock_accept_any_fd", accepted > 0);
    /* A unix socket path is a file name, and files outside the grant do not exist. */
    read_and_show("unix_socket_path", arg("unix"));
    return 0;
}

static int proc_inherited_fds(void)
{
    int readable = 0;
    for (int fd = 3; fd < 1024; fd++) {
        __wasi_fdstat_t st;
        if (fd == 3)
            continue; /* the workspace preopen, granted on purpose */
        if (__wasi_fd_fdstat_get(fd, &st) == 0)
            readable++;
    }
    errno = EBADF;
    attempt("extra_fds", readable > 0);
    return 0;
}

static int proc_fd_exhaustion(void)
{
    int n = 0;
    while (n < 100000 && open("/workspace/attacks.wasm", O_RDONLY) >= 0)
        n++;
    printf("OPENED %d\n", n);
    errno = EMFILE;
    attempt("open_100000", n >= 100000);
    return 0;
}

static int proc_output_flood(void)
{
    static char line[4096];
    memset(line, 'y', sizeof line);
    for (;;)
        fwrite(line, 1, sizeof line, stdout);
}

static int mem_bomb(void)
{
    size_t total = 0;
    for (;;) {
        /* volatile: otherwise the compiler may drop the unused memory, and then the loop. */
        volatile char *p = malloc(1 << 20);
        if (!p) {
            printf("ATTEMPT malloc_unbounded ENOMEM after %zu MiB\n", total >> 20);
            fflush(stdout);
            abort();
        }
        for (size_t i = 0; i < (1 << 20); i += 4096)
            p[i] = 1; /* touch every page: the memory is really used */
        total += 1 << 20;
    }
}

static int time_cpu_spin(void)
{
    volatile unsigned long x = 0;
    for (;;)
        x++;
}

static int time_sleep(void)
{
    sleep(3600);
    attempt("slept_an_hour", 1);
    return 0;
}

struct attack {
    const char *name;
    int (*run)(void);
};

/* The grants door (stockade-wasm's HostCalls ABI): one broker call frame's JSON in, the
 * reply's length out (negative: -1 no grants, -3 the session has ended, -4 bad pointers). */
__attribute__((import_module("host"), import_name("call")))
int32_t host_call(const char *req, int32_t req_len, char *resp, int32_t resp_cap);

static char g_reply[1 << 16];

/* Calls `grant` with raw JSON `args`; ok only if the host answered with a result. */
static int grant(const char *what, const char *grant_name, const char *args)
{
    char req[512];
    int n = snprintf(req, sizeof req, "{\"type\":\"call\",\"id\":1,\"grant\":\"%s\",\"args\":%s}", grant_name, args);
    int32_t got = host_call(req, n, g_reply, (int32_t)sizeof g_reply - 1);
    int ok = got > 0 && got < (int32_t)sizeof g_reply && strstr((g_reply[got] = 0, g_reply), "\"result\":") != NULL;
    if (got < 0)
        printf("ATTEMPT %s door%d\n", what, (int)got);
    else
        printf("ATTEMPT %s %s %.160s\n", what, ok ? "ok" : "EPERM", g_reply);
    return ok;
}

static int grant_ungranted(void)
{
    grant("ungranted_function", "send", "{\"to\":\"anyone\"}");
    grant("denied_arguments", "log", "{\"msg\":\"pwned\"}");
    grant("extra_argument", "log", "{\"msg\":\"ok-a\",\"path\":\"/etc\"}");
    grant("wrong_type", "log", "{\"msg\":7}");
    grant("not_an_object", "log", "[\"ok-a\"]");
    grant("reserved_name", "stockade.admin", "{}");
    return 0;
}

/* Lie to the door: a length past the end of memory, a length over the frame maximum, a
 * reply buffer outside memory; then try a real call. */
static int grant_lying_length(void)
{
    int32_t a = host_call(g_reply, 0x7fffffff, g_reply, 16);
    int32_t b = host_call((const char *)0xfffffff0u, 64, g_reply, 16);
    printf("ATTEMPT lying_lengths door%d door%d\n", (int)a, (int)b);
    grant("call_after_lie", "log", "{\"msg\":\"ok-after-lie\"}");
    return 0;
}

static int grant_flood(void)
{
    int ok = 0;
    for (int i = 0; i < 10000; i++) {
        char args[64];
        snprintf(args, sizeof args, "{\"msg\":\"ok-%d\"}", i);
        char req[160];
        int n = snprintf(req, sizeof req, "{\"type\":\"call\",\"id\":%d,\"grant\":\"log\",\"args\":%s}", i, args);
        int32_t got = host_call(req, n, g_reply, (int32_t)sizeof g_reply);
        if (got <= 0)
            break;
        ok++;
    }
    printf("ATTEMPT flood %s\nDATA %d calls answered\n", ok >= 10000 ? "ok" : "EPERM", ok);
    return 0;
}

/* Only whether the key showed up counts here (the calls themselves are allowed). */
static void key_in_reply(const char *what, const char *grant_name, const char *args)
{
    char req[256];
    int n = snprintf(req, sizeof req, "{\"type\":\"call\",\"id\":1,\"grant\":\"%s\",\"args\":%s}", grant_name, args);
    int32_t got = host_call(req, n, g_reply, (int32_t)sizeof g_reply - 1);
    g_reply[got > 0 && got < (int32_t)sizeof g_reply ? got : 0] = 0;
    int found = strstr(g_reply, "CANARY") != NULL;
    printf("ATTEMPT %s %s\n", what, found ? "ok" : "EPERM");
    if (found)
        printf("DATA %s\n", g_reply);
}

static int grant_key_search(void)
{
    int found = 0;
    for (char **e = environ; e && *e; e++)
        if (strstr(*e, "CANARY")) {
            printf("DATA %s\n", *e);
            found = 1;
        }
    errno = ENOENT;
    attempt("environment_key", found);
    key_in_reply("manifest_key", "stockade.list", "{}");
    key_in_reply("reply_key", "log", "{\"msg\":\"ok-key\"}");
    return 0;
}

static const struct attack ATTACKS[] = {
    { "env_inherited_secret", env_inherited_secret },
    { "fs_cgroupfs", fs_cgroupfs },
    { "fs_disk_fill", fs_disk_fill },
    { "fs_host_layout", fs_host_layout },
    { "fs_kernel_knobs", fs_kernel_knobs },
    { "fs_proc_environ", fs_proc_environ },
    { "fs_read_home_secrets", fs_read_home_secrets },
    { "fs_read_shadow", fs_read_shadow },
    { "fs_special_files", fs_special_files },
    { "fs_symlink_out", fs_symlink_out },
    { "fs_truncate_readonly", fs_truncate_readonly },
    { "fs_write_outside", fs_write_outside },
    { "grant_flood", grant_flood },
    { "grant_key_search", grant_key_search },
    { "grant_lying_length", grant_lying_length },
    { "grant_ungranted", grant_ungranted },
    { "mem_bomb", mem_bomb },
    { "net_metadata_service", net_any },
    { "net_raw_packet", net_any },
    { "net_tcp_loopback", net_any },
    { "net_udp_loopback", net_any },
    { "net_unix_abstract", net_any },
    { "net_unix_pathname", net_any },
    { "proc_fd_exhaustion", proc_fd_exhaustion },
    { "proc_inherited_fds", proc_inherited_fds },
    { "proc_output_flood", proc_output_flood },
    { "time_cpu_spin", time_cpu_spin },
    { "time_sleep", time_sleep },
};

int main(int argc, char **argv)
{
    g_argc = argc;
    g_argv = argv;
    if (argc < 2) {
        fputs("usage: attacks.wasm ATTACK key=value...\n", stderr);
        return 2;
    }
    for (size_t i = 0; i < sizeof ATTACKS / sizeof ATTACKS[0]; i++)
        if (strcmp(argv[1], ATTACKS[i].name) == 0)
            return ATTACKS[i].run();
    fprintf(stderr, "no wasm variant of attack %s\n", argv[1]);
    return 2;
}
