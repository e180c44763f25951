/* rb-helper: the id mapping of mapped sandboxes.
 *
 * The user-namespace id mapping part of ``rb-helper``.
 *
 * Owns the syscalls that make a sandbox's root an unprivileged host id (``userns = "mapped"``
 * in :class:`~rollbank.sandbox.local.config.LocalSandboxConfig`; design in docs/collect.md,
 * "What the sandbox isolation promises"):
 *
 * * ``make_userns(ID, COUNT)`` (the probe's): a user namespace mapping ids ``0..COUNT-1`` to
 *   host ``ID..ID+COUNT-1`` (a short-lived child unshares it; the host-root parent writes its
 *   maps and keeps a descriptor). It only serves as the id map of idmapped mounts; a sandbox's
 *   init gets the backend's instead (:func:`rollbank.sandbox.local.userns.mapping_userns`).
 * * ``idmap_layer(SRC, DST, USERNS)``: ``open_tree(OPEN_TREE_CLONE)`` +
 *   ``mount_setattr(MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY)`` + ``move_mount``: a read-only view of
 *   a layer in which its root-owned files are owned by ``ID`` (the layer on disk is unchanged
 *   and shared by every sandbox).
 * * ``drop_to(ID)``: the init's last step before it execs bubblewrap as host ``ID`` (no
 *   supplementary groups, no capabilities); bubblewrap then maps the sandbox's root to ``ID``.
 * * ``rb-helper probe MOUNT_DIR ID COUNT BWRAP``: whether this kernel and the filesystem holding
 *   ``MOUNT_DIR``'s parent can do all of it (an idmapped layer under an overlay with a tmpfs
 *   upper, and ``BWRAP --unshare-user --disable-userns`` run as ``ID``: no sysctl or security
 *   module forbids it), in a private mount namespace that vanishes with the probe. Exit 0, or
 *   non-zero with the failing step on stderr.
 *
 * Raw syscall numbers (unified across architectures since Linux 5.2/5.12) and private constant
 * names: the helper must build on a libc that lacks the wrappers or ships conflicting headers.
 */
#include "rb-helper.h"

#define RB_SYS_open_tree 428
#define RB_SYS_move_mount 429
#define RB_SYS_mount_setattr 442
#define RB_OPEN_TREE_CLONE 1
#define RB_AT_EMPTY_PATH 0x1000
#define RB_MOVE_MOUNT_F_EMPTY_PATH 0x4
#define RB_MOUNT_ATTR_RDONLY 0x1ULL
#define RB_MOUNT_ATTR_IDMAP 0x100000ULL

struct rb_mount_attr {
    unsigned long long attr_set, attr_clr, propagation, userns_fd;
};

static void write_map(pid_t pid, const char *file, unsigned long id, unsigned long count) {
    char path[64], map[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, file);
    int len = snprintf(map, sizeof map, "0 %lu %lu\n", id, count);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, map, len) != len) die_at("write", path);
    close(fd);
}

static int make_userns(unsigned long id, unsigned long count) {
    int ready[2], done[2];
    char b = 0;
    if (pipe2(ready, O_CLOEXEC) || pipe2(done, O_CLOEXEC)) die("pipe");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        close(ready[0]);
        close(done[1]);
        if (unshare(CLONE_NEWUSER)) _exit(1);
        if (write(ready[1], "u", 1) != 1) _exit(1);
        if (read(done[0], &b, 1) < 0) _exit(1);  /* until the parent closes its end */
        _exit(0);
    }
    close(ready[1]);
    close(done[0]);
    if (read(ready[0], &b, 1) != 1) { errno = EPERM; die("unshare user namespace"); }
    write_map(child, "uid_map", id, count);
    write_map(child, "gid_map", id, count);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)child);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) die("open the mapping's user namespace");
    close(done[1]);
    close(ready[0]);
    while (waitpid(child, NULL, 0) < 0 && errno == EINTR) {}
    return fd;
}

/* A detached read-only clone of the tree at src, id-mapped through userns ("what" names the
 * step in the error when the filesystem refuses the mapping). */
static int idmapped_tree(const char *src, int userns, const char *what) {
    int fd = (int)syscall(RB_SYS_open_tree, AT_FDCWD, src, RB_OPEN_TREE_CLONE | O_CLOEXEC);
    if (fd < 0) die_at("open_tree", src);
    struct rb_mount_attr a = {RB_MOUNT_ATTR_IDMAP | RB_MOUNT_ATTR_RDONLY, 0, 0,
                              (unsigned long long)userns};
    if (syscall(RB_SYS_mount_setattr, fd, "", RB_AT_EMPTY_PATH, &a, sizeof a)) die_at(what, src);
    return fd;
}

void idmap_layer(const char *src, const char *dst, int userns) {
    int fd = idmapped_tree(src, userns, "idmap (mount_setattr) layer");
    if (mkdir(dst, 0755)) die_at("mkdir", dst);
    if (syscall(RB_SYS_move_mount, fd, "", AT_FDCWD, dst, RB_MOVE_MOUNT_F_EMPTY_PATH))
        die_at("move_mount", dst);
    close(fd);
}

void drop_to(unsigned long id) {
    if (setgroups(0, NULL)) die("setgroups");
    if (setresgid(id, id, id)) die("setresgid to the mapped id");
    if (setresuid(id, id, id)) die("setresuid to the mapped id");
}

/* The sandbox's full id range: bubblewrap (--userns-block-fd B --info-fd I) unshares the
   sandbox's user namespace and waits on B; a mapper forked here (still host root) reads the
   namespace's first process from I, writes uid/gid maps "0 ID COUNT", sets that namespace's
   user.max_user_namespaces to 0 (no nested namespaces: what --disable-userns did), and only
   then unblocks B. If the mapper fails, B closes unwritten and bubblewrap, unmapped, fails
   to start: the sandbox never runs with a partial map. *blk / *info: bubblewrap's ends. */
static void map_child(pid_t pid, unsigned long id, unsigned long count) {
    char path[64], line[96];
    int len = snprintf(line, sizeof line, "0 %lu %lu\n", id, count);
    const char *maps[] = {"uid_map", "gid_map"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, maps[i]);
        int fd = open(path, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, line, len) != len) die_at("write", path);
        close(fd);
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWUSER)) die_at("setns", path);
    int fd = open("/proc/sys/user/max_user_namespaces", O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, "0\n", 2) != 2) die("disable nested user namespaces");
    close(fd);
}

void full_map_fork(unsigned long id, unsigned long count, int *blk, int *info) {
    int b[2], i[2];
    if (pipe(b) || pipe(i)) die("pipe");
    /* forked once, not waited for: once the init has exec'd bubblewrap, the mapper is
       bubblewrap's child, which bubblewrap reaps as any other (waitpid(-1) when SIGCHLD
       comes); the backend learns the anchor's pid from the anchor itself (its ready byte),
       so the mapper beside it is no ambiguity. No extra fork and wait on the start's path. */
    pid_t mapper = fork();
    if (mapper < 0) die("fork mapper");
    if (mapper == 0) {
        prctl(PR_SET_NAME, "rb-mapper", 0, 0, 0);
        close(b[0]);
        close(i[1]);
        char buf[2048] = {0};
        size_t got = 0;
        char *at = NULL;
        while (got < sizeof buf - 1) {  /* {"child-pid": N, ...}: all of it, or bwrap gets EPIPE */
            ssize_t r = read(i[0], buf + got, sizeof buf - 1 - got);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            got += (size_t)r;
            buf[got] = 0;
            if (strchr(buf, '}')) break;
        }
        at = strstr(buf, "\"child-pid\":");
        if (!at) _exit(125);
        pid_t pid = (pid_t)strtol(at + strlen("\"child-pid\":"), NULL, 10);
        if (pid <= 0) _exit(125);
        map_child(pid, id, count);
        if (write(b[1], "1", 1) != 1) _exit(125);
        while (read(i[0], buf, sizeof buf) > 0) {}  /* whatever bwrap writes later */
        _exit(0);
    }
    close(b[1]);
    close(i[0]);
    *blk = b[0];
    *info = i[1];
}

int do_probe(int argc, char **argv) {
    /* probe MOUNT_DIR ID COUNT BWRAP */
    if (argc < 6) { fprintf(stderr, "rb-helper: probe: bad arguments\n"); return 125; }
    const char *mdir = argv[2];
    unsigned long id = strtoul(argv[3], NULL, 10), count = strtoul(argv[4], NULL, 10);
    char parent[4096], path[4200], opts[8800];
    snprintf(parent, sizeof parent, "%s/..", mdir);
    if (unshare(CLONE_NEWNS)) die("unshare mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("make / private");
    int userns = make_userns(id, count);
    int fd = idmapped_tree(parent, userns, "idmapped mounts unsupported on the filesystem of");
    if (mount("rollbank-probe", mdir, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755"))
        die("mount tmpfs");
    snprintf(path, sizeof path, "%s/lower", mdir);
    if (mkdir(path, 0755)) die("mkdir");
    if (syscall(RB_SYS_move_mount, fd, "", AT_FDCWD, path, RB_MOVE_MOUNT_F_EMPTY_PATH))
        die("move_mount");
    const char *subs[] = {"upper", "work", "root"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", mdir, subs[i]);
        if (mkdir(path, 0755)) die("mkdir");
    }
    snprintf(path, sizeof path, "%s/upper", mdir);
    if (chown(path, id, id)) die("chown upper");
    snprintf(opts, sizeof opts, "lowerdir=%s/lower,upperdir=%s/upper,workdir=%s/work",
             mdir, mdir, mdir);
    snprintf(path, sizeof path, "%s/root", mdir);
    if (mount("rollbank-probe", path, "overlay", 0, opts))
        die("overlay over an idmapped lower layer");
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        drop_to(id);
        execl(argv[5], argv[5], "--bind", "/", "/", "--unshare-user", "--disable-userns",
              "--uid", "0", "--gid", "0", "--", "/bin/true", (char *)NULL);
        die_at("exec", argv[5]);
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 125;
}
