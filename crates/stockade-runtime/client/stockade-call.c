/*
 * stockade-call: the grants client for sandboxed programs (process and docker tiers).
 *
 *   stockade-call NAME [JSON]     call grant NAME with the JSON arguments (default {}; "-"
 *                                 reads them from stdin) and print the result as JSON
 *   stockade-call --list          print the run's manifest of grants
 *
 * Exit status: 0 with the result on stdout; 1 when the broker answered with an error
 * ("stockade-call: CODE: MESSAGE" on stderr); 2 for a usage or transport error.
 *
 * It connects to $STOCKADE_BROKER (default /run/stockade/grants.sock, then
 * /broker/grants.sock) and speaks the broker's wire protocol, version 1
 * (stockade-protocol's `broker` module): a u32 big-endian length, then one JSON call; the
 * reply comes back the same way. The host writes a reply's keys in a fixed order, so the
 * result is found without a JSON parser. Built statically by stockade-runtime's build
 * script so that it runs in any image, including a busybox one.
 *
 * This runs inside the sandbox as the guest: nothing here is trusted by the host, which
 * checks every frame it receives.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_ARGS (1u << 20)
#define MAX_REPLY (4u << 20)

static int fail(const char *what)
{
    fprintf(stderr, "stockade-call: %s%s%s\n", what, errno ? ": " : "", errno ? strerror(errno) : "");
    return 2;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int connect_broker(void)
{
    const char *env = getenv("STOCKADE_BROKER");
    const char *paths[] = { env, "/run/stockade/grants.sock", "/broker/grants.sock" };
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        const char *path = paths[i];
        if (!path || !*path)
            continue;
        struct sockaddr_un addr = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof addr.sun_path)
            continue;
        strcpy(addr.sun_path, path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        if (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0)
            return fd;
        close(fd);
        if (env && path == env)
            return -1;
    }
    errno = ENOENT;
    return -1;
}

/* A grant name as the broker accepts it: 1-64 bytes of [A-Za-z0-9_.-]. */
static int valid_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 64)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '.' || *s == '-'))
            return 0;
    return 1;
}

static char *read_stdin(size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n == cap) {
            if (cap >= MAX_ARGS)
                break;
            char *grown = realloc(buf, cap * 2);
            if (!grown)
                break;
            buf = grown;
            cap *= 2;
        }
        ssize_t r = read(0, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            break;
        if (r == 0) {
            *len = n;
            return buf;
        }
        n += (size_t)r;
    }
    free(buf);
    return NULL;
}

int main(int argc, char **argv)
{
    const char *name;
    const char *args = "{}";
    char *owned = NULL;
    size_t args_len;
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        name = "stockade.list";
    } else if (argc == 2 || argc == 3) {
        name = argv[1];
        if (argc == 3)
            args = argv[2];
    } else {
        fputs("usage: stockade-call NAME [JSON|-]\n       stockade-call --list\n", stderr);
        return 2;
    }
    if (!valid_name(name)) {
        fprintf(stderr, "stockade-call: invalid grant name \"%s\"\n", name);
        return 2;
    }
    if (strcmp(args, "-") == 0) {
        owned = read_stdin(&args_len);
        if (!owned) {
            errno = 0;
            return fail("cannot read the arguments from stdin (at most 1 MiB)");
        }
        args = owned;
    } else {
        args_len = strlen(args);
    }
    /* The arguments go verbatim: the broker parses and checks them. */
    static const char head[] = "{\"type\":\"call\",\"id\":1,\"grant\":\"";
    static const char mid[] = "\",\"args\":";
    size_t len = sizeof head - 1 + strlen(name) + sizeof mid - 1 + args_len + 1;
    char *frame = malloc(4 + len);
    if (!frame)
        return fail("out of memory");
    uint32_t be = htonl((uint32_t)len);
    memcpy(frame, &be, 4);
    char *p = frame + 4;
    memcpy(p, head, sizeof head - 1), p += sizeof head - 1;
    memcpy(p, name, strlen(name)), p += strlen(name);
    memcpy(p, mid, sizeof mid - 1), p += sizeof mid - 1;
    memcpy(p, args, args_len), p += args_len;
    *p = '}';

    int fd = connect_broker();
    if (fd < 0)
        return fail("cannot reach the broker (is this run granted anything?)");
    if (write_all(fd, frame, 4 + len) != 0)
        return fail("the broker closed the connection");
    uint32_t rlen_be;
    if (read_all(fd, &rlen_be, 4) != 0) {
        errno = 0;
        return fail("the broker ended the session (see the run's report)");
    }
    uint32_t rlen = ntohl(rlen_be);
    if (rlen == 0 || rlen > MAX_REPLY) {
        errno = 0;
        return fail("the broker sent a reply of an impossible length");
    }
    char *reply = malloc(rlen + 1);
    if (!reply || read_all(fd, reply, rlen) != 0)
        return fail("the broker's reply was cut short");
    reply[rlen] = '\0';
    close(fd);

    /* {"type":"reply","id":1,"result":VALUE} or {"type":"reply","id":1,"error":{...}} */
    static const char ok[] = "{\"type\":\"reply\",\"id\":1,\"result\":";
    static const char err[] = "{\"type\":\"reply\",\"id\":1,\"error\":";
    if (rlen > sizeof ok - 1 && memcmp(reply, ok, sizeof ok - 1) == 0 && reply[rlen - 1] == '}') {
        fwrite(reply + sizeof ok - 1, 1, rlen - (sizeof ok - 1) - 1, stdout);
        fputc('\n', stdout);
        return fflush(stdout) == 0 ? 0 : 2;
    }
    if (rlen > sizeof err - 1 && memcmp(reply, err, sizeof err - 1) == 0) {
        fprintf(stderr, "stockade-call: %.*s\n", (int)(rlen - (sizeof err - 1) - 1), reply + sizeof err - 1);
        return 1;
    }
    errno = 0;
    return fail("the broker sent a reply this client does not understand");
}
