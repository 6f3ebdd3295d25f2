/* A minimal NCCL net plug-in for the tests: interface v8, TCP over the
 * loopback interface, one buffer per receive. Written against our own
 * declarations of the v8 interface (the layouts of NCCL's net_v8.h).
 *
 * Messages are a 16-byte header (size, tag, magic) and the bytes. Nothing
 * blocks: connect and accept take several calls (the connecting side says
 * hello on its second call, the accepting side answers it), and transfers
 * move only when test is called. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef int ncclResult_t;
enum { ok = 0, system_error = 2, internal_error = 3 };
typedef void (*logger_t)(int level, unsigned long flags, const char *file, int line,
                         const char *fmt, ...);
enum { LOG_WARN = 2, SUBSYS_NET = 0x10, PTR_HOST = 1, MAX_REQUESTS = 32 };

typedef struct {
    char *name;
    char *pciPath;
    uint64_t guid;
    int ptrSupport, regIsGlobal, speed, port;
    float latency;
    int maxComms, maxRecvs, netDeviceType, netDeviceVersion;
} props_v8_t;

static logger_t logger;
#define WARN(...) (logger ? logger(LOG_WARN, SUBSYS_NET, __FILE__, __LINE__, __VA_ARGS__) : (void)0)

#define MAGIC 0x4c4f4f50u /* "LOOP" */
struct header { uint64_t size; int32_t tag; uint32_t magic; };

struct handle { uint32_t magic; uint16_t port; uint8_t stage; int32_t fd; };

struct comm;

struct request {
    struct comm *comm; /* never used after its comm is closed */
    int send;
    char *data;
    size_t size;     /* bytes of the message (send) or room (receive) */
    int tag;
    size_t moved;    /* bytes of header and body moved */
    struct header hdr;
    int done;
};

struct comm {
    int fd;
    int send;
    int failed;
    struct request *queue[MAX_REQUESTS]; /* pending, in posting order */
    int head, count;
};

struct listen_comm { int fd; int pending; };

static int nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL, 0);
    return fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static ncclResult_t init(logger_t log) {
    logger = log;
#ifdef LOOPBACK_FAIL_INIT
    WARN("loopback: no loopback device here (built to fail)");
    return system_error;
#else
    return ok;
#endif
}
static ncclResult_t devices(int *n) { *n = 1; return ok; }

static ncclResult_t get_properties(int dev, props_v8_t *p) {
    if (dev != 0) { WARN("loopback: no device %d", dev); return internal_error; }
    memset(p, 0, sizeof *p);
    p->name = "lo";
    p->ptrSupport = PTR_HOST;
    p->speed = 10000;
    p->maxComms = 1024;
    p->maxRecvs = 1;
    return ok;
}

static ncclResult_t listen_(int dev, void *opaque, void **listen_comm) {
    struct handle *h = opaque;
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof addr;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    (void)dev;
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, sizeof addr) || listen(fd, 16) ||
        getsockname(fd, (struct sockaddr *)&addr, &len) || nonblocking(fd)) {
        WARN("loopback: listen: %s", strerror(errno));
        if (fd >= 0) close(fd);
        return system_error;
    }
    memset(h, 0, sizeof *h);
    h->magic = MAGIC;
    h->port = ntohs(addr.sin_port);
    h->fd = -1;
    struct listen_comm *l = calloc(1, sizeof *l);
    l->fd = fd;
    l->pending = -1;
    *listen_comm = l;
    return ok;
}

static struct comm *new_comm(int fd, int send) {
    struct comm *c = calloc(1, sizeof *c);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->fd = fd;
    c->send = send;
    return c;
}

/* Stage 0: start connecting; 1: say hello; 2: wait for the answer. */
static ncclResult_t connect_(int dev, void *opaque, void **send_comm, void **dev_comm) {
    struct handle *h = opaque;
    (void)dev;
    *send_comm = NULL;
    if (dev_comm) *dev_comm = NULL;
    if (h->magic != MAGIC) { WARN("loopback: a malformed handle"); return internal_error; }
    if (h->stage == 0) {
        struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(h->port),
                                    .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || nonblocking(fd) ||
            (connect(fd, (struct sockaddr *)&addr, sizeof addr) && errno != EINPROGRESS)) {
            WARN("loopback: connect to port %d: %s", h->port, strerror(errno));
            if (fd >= 0) close(fd);
            return system_error;
        }
        h->fd = fd;
        h->stage = 1;
        return ok;
    }
    if (h->stage == 1) {
        ssize_t n = send(h->fd, "H", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n == 1) h->stage = 2;
        else if (n < 0 && errno != EAGAIN && errno != ENOTCONN) {
            WARN("loopback: connect to port %d: %s", h->port, strerror(errno));
            close(h->fd);
            h->stage = 0;
            return system_error;
        }
        return ok;
    }
    char answer;
    ssize_t n = recv(h->fd, &answer, 1, MSG_DONTWAIT);
    if (n == 1 && answer == 'A') {
        *send_comm = new_comm(h->fd, 1);
        h->stage = 0;
        h->fd = -1;
    } else if (n == 0 || (n < 0 && errno != EAGAIN)) {
        WARN("loopback: connect to port %d: no answer", h->port);
        close(h->fd);
        h->stage = 0;
        return system_error;
    }
    return ok;
}

static ncclResult_t accept_(void *opaque, void **recv_comm, void **dev_comm) {
    struct listen_comm *l = opaque;
    *recv_comm = NULL;
    if (dev_comm) *dev_comm = NULL;
    if (l->pending < 0) {
        int fd = accept(l->fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) return ok;
            WARN("loopback: accept: %s", strerror(errno));
            return system_error;
        }
        nonblocking(fd);
        l->pending = fd;
    }
    char hello;
    ssize_t n = recv(l->pending, &hello, 1, MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) return ok;
    if (n != 1 || hello != 'H' || send(l->pending, "A", 1, MSG_NOSIGNAL) != 1) {
        close(l->pending);
        l->pending = -1;
        return ok; /* not one of ours: keep listening */
    }
    *recv_comm = new_comm(l->pending, 0);
    l->pending = -1;
    return ok;
}

static ncclResult_t reg_mr(void *comm, void *data, size_t size, int type, void **mhandle) {
    (void)comm; (void)data; (void)size;
    if (type != PTR_HOST) { WARN("loopback: host memory only"); return internal_error; }
    *mhandle = malloc(1);
    return ok;
}

static ncclResult_t dereg_mr(void *comm, void *mhandle) { (void)comm; free(mhandle); return ok; }

static ncclResult_t post(struct comm *c, int send, void *data, size_t size, int tag, void **request) {
    *request = NULL;
    if (c->failed) { WARN("loopback: the connection failed earlier"); return system_error; }
    if (c->count == MAX_REQUESTS) return ok; /* try again later */
    struct request *r = calloc(1, sizeof *r);
    r->comm = c;
    r->send = send;
    r->data = data;
    r->size = size;
    r->tag = tag;
    r->hdr = (struct header){ size, tag, MAGIC };
    c->queue[(c->head + c->count++) % MAX_REQUESTS] = r;
    *request = r;
    return ok;
}

static ncclResult_t isend(void *comm, void *data, int size, int tag, void *mhandle, void **request) {
    (void)mhandle;
    return post(comm, 1, data, (size_t)size, tag, request);
}

static ncclResult_t irecv(void *comm, int n, void **data, int *sizes, int *tags, void **mhandles,
                          void **request) {
    (void)mhandles;
    if (n != 1) { WARN("loopback: one buffer per receive"); return internal_error; }
    return post(comm, 0, data[0], (size_t)sizes[0], tags[0], request);
}

static ncclResult_t fail(struct comm *c) { c->failed = 1; return system_error; }

/* Moves the front requests as far as the socket allows. */
static ncclResult_t progress(struct comm *c) {
    while (c->count > 0) {
        struct request *r = c->queue[c->head];
        size_t hdr = sizeof r->hdr;
        while (r->moved < hdr + (r->moved < hdr ? 0 : r->hdr.size)) {
            char *at;
            size_t left;
            if (r->moved < hdr) { at = (char *)&r->hdr + r->moved; left = hdr - r->moved; }
            else { at = r->data + (r->moved - hdr); left = r->hdr.size - (r->moved - hdr); }
            ssize_t n = r->send ? send(c->fd, at, left, MSG_NOSIGNAL | MSG_DONTWAIT)
                                : recv(c->fd, at, left, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return ok;
            if (n < 0) { WARN("loopback: %s: %s", r->send ? "send" : "receive", strerror(errno)); return fail(c); }
            if (n == 0) {
                WARN("loopback: connection closed by the peer%s",
                     r->moved > 0 ? " in the middle of a message" : "");
                return fail(c);
            }
            r->moved += (size_t)n;
            if (!r->send && r->moved == hdr) {
                if (r->hdr.magic != MAGIC) { WARN("loopback: a malformed message"); return fail(c); }
                if (r->hdr.size > r->size) {
                    WARN("loopback: a message of %llu bytes into a receive of %zu",
                         (unsigned long long)r->hdr.size, r->size);
                    return fail(c);
                }
                if (r->hdr.tag != r->tag) { WARN("loopback: unexpected tag %d", r->hdr.tag); return fail(c); }
            }
        }
        r->done = 1;
        c->head = (c->head + 1) % MAX_REQUESTS;
        c->count--;
    }
    return ok;
}

static ncclResult_t test(void *request, int *done, int *sizes) {
    struct request *r = request;
    *done = 0;
    if (!r->done) {
        if (r->comm->failed) { WARN("loopback: the connection failed earlier"); return system_error; }
        if (progress(r->comm) != ok) return system_error;
        if (!r->done) return ok;
    }
    *done = 1;
    if (sizes) sizes[0] = (int)r->hdr.size;
    free(r);
    return ok;
}

static ncclResult_t close_comm(void *comm) {
    struct comm *c = comm;
    close(c->fd);
    free(c);
    return ok;
}

static ncclResult_t close_listen(void *opaque) {
    struct listen_comm *l = opaque;
    if (l->pending >= 0) close(l->pending);
    close(l->fd);
    free(l);
    return ok;
}

static ncclResult_t iflush(void *comm, int n, void **data, int *sizes, void **mhandles, void **request) {
    (void)comm; (void)n; (void)data; (void)sizes; (void)mhandles;
    *request = NULL; /* host memory: nothing to flush */
    return ok;
}

struct net_v8 {
    const char *name;
    ncclResult_t (*init)(logger_t);
    ncclResult_t (*devices)(int *);
    ncclResult_t (*getProperties)(int, props_v8_t *);
    ncclResult_t (*listen)(int, void *, void **);
    ncclResult_t (*connect)(int, void *, void **, void **);
    ncclResult_t (*accept)(void *, void **, void **);
    ncclResult_t (*regMr)(void *, void *, size_t, int, void **);
    ncclResult_t (*regMrDmaBuf)(void *, void *, size_t, int, uint64_t, int, void **);
    ncclResult_t (*deregMr)(void *, void *);
    ncclResult_t (*isend)(void *, void *, int, int, void *, void **);
    ncclResult_t (*irecv)(void *, int, void **, int *, int *, void **, void **);
    ncclResult_t (*iflush)(void *, int, void **, int *, void **, void **);
    ncclResult_t (*test)(void *, int *, int *);
    ncclResult_t (*closeSend)(void *);
    ncclResult_t (*closeRecv)(void *);
    ncclResult_t (*closeListen)(void *);
    void *getDeviceMr;
    void *irecvConsumed;
};

const struct net_v8 ncclNetPlugin_v8 = {
    "Loopback", init, devices, get_properties, listen_, connect_, accept_,
    reg_mr, NULL, dereg_mr, isend, irecv, iflush, test, close_comm, close_comm, close_listen,
    NULL, NULL,
};
