/* rb-helper: the pinned verifier's view (``vexec``).
 *
 * Owns how ``rb-helper vexec`` builds a pinned command's private root (docs/collect.md,
 * "Verifier isolation"). The rule: the command runs in a root ASSEMBLED FRESH in its own
 * mount namespace, not in the agent's root with patches on top:
 *
 * - the root directory itself is a new tmpfs; every entry the pristine layers have at ``/``
 *   as a symlink (the merged-usr links ``/bin``, ``/sbin``, ``/lib*``) is recreated from the
 *   pristine layers, and every one-component pin (``/usr``) is the pristine directory (an
 *   overlay with a throw-away tmpfs upper), whatever the agent made of them;
 * - every other directory the agent has at ``/`` is bound in as it is (the state under
 *   test: ``/app``, ``/etc``, ``/root``, ``/tmp``...; opened with ``O_NOFOLLOW``, so a
 *   directory swapped for a symlink meanwhile is skipped); a symlink the agent put where the
 *   pristine layers have a directory is recreated (it is state); any other non-directory the
 *   agent added at ``/`` (``/pytest.ini``, ``/conftest.py``, a symlink) does not exist;
 * - a ``+/a/b/c`` pin is a fresh private directory, reached through a fresh spine: ``/a`` and
 *   ``/a/b`` are new directories into which the agent's other entries are bound (never
 *   following the agent's symlinks, never writing into the agent's tree): ``/tests``,
 *   ``/logs/verifier``, the shim directory, the command's own scratch directory;
 * - then, inside that root (``pivot_root``: the agent's root is gone from the view), each
 *   deeper pin shows the pristine version (``pin``: a directory as an overlay of the pristine
 *   one with a throw-away upper, a file as a read-only bind; where the pristine layers have
 *   nothing, an empty tmpfs over a directory the agent made and ``/dev/null`` over a file);
 *   a pristine directory the agent replaced by a non-directory (or the reverse) exits 126.
 *
 * The pristine layers are uncovered at ``PRISTINE`` (bound read-only in every sandbox under
 * an empty tmpfs) and bound at ``SCRATCH/pristine`` while the view is built, then unmounted.
 * Runs in the forked child, in a fresh mount namespace, as the root of bwrap's outer user
 * namespace (which owns the mount namespace), before it enters the sandbox's own.
 */
#include "rb-helper.h"

#define SCRATCH "/.rollbank-verifier"
#define SRC SCRATCH "/pristine"
#define MAX_PINS 256

static char *top_pins[MAX_PINS], *deep_pins[MAX_PINS], *private_pins[MAX_PINS];
static int n_top, n_deep, n_private;

static void fd_path(char *buf, size_t n, int fd) { snprintf(buf, n, "/proc/self/fd/%d", fd); }

static void cover(const char *target) {
    /* /dev/null over a non-directory (a symlink itself, through an O_PATH descriptor) */
    char fdp[64];
    int fd = open(target, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    fd_path(fdp, sizeof fdp, fd);
    if (mount("/dev/null", fdp, NULL, MS_BIND, NULL)) die_at("cover", target);
    close(fd);
}

static void overlay_at(const char *p, const char *lower) {
    /* a throw-away tmpfs holds the upper layer; the overlay goes on top of it */
    char up[1100], wk[1100], opts[3400];
    if (mount("rollbank-pin", p, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")) die_at("pin tmpfs", p);
    snprintf(up, sizeof up, "%s/.u", p);
    snprintf(wk, sizeof wk, "%s/.w", p);
    if (mkdir(up, 0755) || mkdir(wk, 0755)) die_at("pin dirs", p);
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", lower, up, wk);
    if (mount("rollbank-pin", p, "overlay", 0, opts)) die_at("pin overlay", p);
}

static void bind_ro(const char *src, const char *dst) {
    if (mount(src, dst, NULL, MS_BIND, NULL)) die_at("bind pinned file", dst);
    if (mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL)) die_at("remount pin", dst);
}

static void pin(const char *p) {
    /* a deeper pin, inside the assembled root */
    char src[1100];
    struct stat ps, as;
    snprintf(src, sizeof src, SRC "%s", p);
    int have = lstat(p, &as) == 0;
    if (lstat(src, &ps) != 0) {  /* not in the pristine layers: hide what the agent put there */
        if (have && S_ISDIR(as.st_mode)) {
            if (mount("rollbank-pin", p, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"))
                die_at("hide", p);
        } else if (have) {
            cover(p);
        }
        return;
    }
    if (!have) return;  /* the agent deleted it: it stays deleted (no write into its tree) */
    if (S_ISDIR(ps.st_mode) != S_ISDIR(as.st_mode)) {
        fprintf(stderr, "rollbank: the verifier's toolchain path %s was replaced in the "
                "sandbox\n", p);
        _exit(126);
    }
    if (S_ISDIR(ps.st_mode)) overlay_at(p, src);
    else if (S_ISLNK(as.st_mode) || S_ISLNK(ps.st_mode)) cover(p);
    else bind_ro(src, p);
}

static int listed(char **list, int n, const char *name, size_t len) {
    /* whether one of list's paths has ``name`` (len bytes) as its first component */
    for (int i = 0; i < n; i++) {
        const char *q = list[i] + 1;
        if (strncmp(q, name, len) == 0 && (q[len] == '/' || q[len] == 0)) return 1;
    }
    return 0;
}

static void bind_entry(int dirfd, const char *name, const char *dst, int is_dir) {
    /* bind the agent's entry ``name`` of ``dirfd`` at ``dst`` without following a symlink */
    char fdp[64];
    int fd = openat(dirfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC | (is_dir ? O_DIRECTORY : 0));
    if (fd < 0) return;  /* gone, or swapped for a symlink meanwhile */
    if (is_dir) {
        if (mkdir(dst, 0755)) die_at("mkdir", dst);
    } else {
        int f = open(dst, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
        if (f < 0) die_at("create", dst);
        close(f);
    }
    fd_path(fdp, sizeof fdp, fd);
    if (mount(fdp, dst, NULL, MS_BIND | (is_dir ? MS_REC : 0), NULL)) die_at("bind", dst);
    close(fd);
}

static void copy_link(int dirfd, const char *name, const char *dst) {
    char target[4096];
    ssize_t n = readlinkat(dirfd, name, target, sizeof target - 1);
    if (n < 0) return;
    target[n] = 0;
    if (symlink(target, dst)) die_at("symlink", dst);
}

static void spine(const char *agent, const char *dst, const char *rest) {
    /* ``dst``: a fresh directory holding the agent's entries of ``agent`` (which may not
       exist; NULL: none) but the first component of ``rest``, itself a fresh spine ("" ends
       it). Private pins share no parent but the scratch directory. */
    if (mkdir(dst, 0755) && errno != EEXIST) die_at("mkdir", dst);
    if (!*rest) return;
    const char *slash = strchr(rest, '/');
    size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
    char name[256], a[2048], d[2048];
    snprintf(name, sizeof name, "%.*s", (int)len, rest);
    int dirfd = agent ? open(agent, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (dirfd >= 0) {
        DIR *dir = fdopendir(dirfd);
        if (!dir) die_at("opendir", agent);
        struct dirent *e;
        struct stat st;
        while ((e = readdir(dir)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || !strcmp(e->d_name, name))
                continue;
            if (fstatat(dirfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW)) continue;
            snprintf(d, sizeof d, "%s/%s", dst, e->d_name);
            if (S_ISLNK(st.st_mode)) copy_link(dirfd, e->d_name, d);
            else bind_entry(dirfd, e->d_name, d, S_ISDIR(st.st_mode));
        }
        closedir(dir);
    }
    snprintf(a, sizeof a, "%s/%s", agent ? agent : "", name);
    snprintf(d, sizeof d, "%s/%s", dst, name);
    spine(agent ? a : NULL, d, slash ? slash + 1 : "");
}

static void assemble(const char *root, int pristine) {
    /* the entries of the new root (see the file's comment) */
    char dst[1024], src[1024];
    struct stat st, ag;
    struct dirent *e;
    int pfd = openat(pristine, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = pfd < 0 ? NULL : fdopendir(pfd);
    if (!dir) die("open the pristine root");
    while ((e = readdir(dir)) != NULL) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || fstatat(pfd, n, &st, AT_SYMLINK_NOFOLLOW))
            continue;
        snprintf(dst, sizeof dst, "%s/%s", root, n);
        if (listed(private_pins, n_private, n, strlen(n))) continue;
        if (S_ISLNK(st.st_mode)) {
            copy_link(pfd, n, dst);
        } else if (S_ISDIR(st.st_mode) && listed(top_pins, n_top, n, strlen(n))) {
            if (mkdir(dst, 0755)) die_at("mkdir", dst);
            snprintf(src, sizeof src, "%s" SRC "/%s", root, n);
            overlay_at(dst, src);
        } else if (!S_ISDIR(st.st_mode)) {
            snprintf(src, sizeof src, "%s" SRC "/%s", root, n);
            int f = open(dst, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
            if (f < 0) die_at("create", dst);
            close(f);
            bind_ro(src, dst);
        }
    }
    int afd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *agent = afd < 0 ? NULL : fdopendir(afd);
    if (!agent) die("opendir /");
    while ((e = readdir(agent)) != NULL) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..") || fstatat(afd, n, &ag, AT_SYMLINK_NOFOLLOW))
            continue;
        snprintf(dst, sizeof dst, "%s/%s", root, n);
        int in_pristine = fstatat(pfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0;
        if ((in_pristine && !S_ISDIR(st.st_mode)) || listed(top_pins, n_top, n, strlen(n)) ||
            listed(private_pins, n_private, n, strlen(n)) || !strcmp(n, SCRATCH + 1))
            continue;  /* the pristine version, a pin, or a private directory */
        if (S_ISDIR(ag.st_mode)) bind_entry(afd, n, dst, 1);
        else if (S_ISLNK(ag.st_mode) && in_pristine) copy_link(afd, n, dst);
        /* any other non-directory the agent added at / does not exist here */
    }
    closedir(agent);
    closedir(dir);
    for (int i = 0; i < n_private; i++) {  /* fresh spines, agent entries beside them */
        snprintf(dst, sizeof dst, "%s%s", root, private_pins[i]);
        const char *rest = private_pins[i] + 1, *slash = strchr(rest, '/');
        size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
        char top[256], agent_top[300], d[1024];
        snprintf(top, sizeof top, "%.*s", (int)len, rest);
        snprintf(agent_top, sizeof agent_top, "/%s", top);
        snprintf(d, sizeof d, "%s/%s", root, top);
        spine(strcmp(top, SCRATCH + 1) ? agent_top : NULL, d, slash ? slash + 1 : "");
    }
}

void pin_toolchain(char *pins) {
    /* in the forked child (its /proc/self is the sandbox's), before exec */
    for (char *p = strtok(pins, "\n"); p; p = strtok(NULL, "\n")) {
        if (p[0] == '+' && p[1] == '/' && n_private < MAX_PINS) private_pins[n_private++] = p + 1;
        else if (p[0] == '/' && strchr(p + 1, '/') == NULL && n_top < MAX_PINS) top_pins[n_top++] = p;
        else if (p[0] == '/' && n_deep < MAX_PINS) deep_pins[n_deep++] = p;
    }
    if (unshare(CLONE_NEWNS)) die("unshare verifier mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("make / private");
    if (umount2(PRISTINE, MNT_DETACH)) die("uncover pristine layers");
    int pristine = open(PRISTINE, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (pristine < 0) die("open the pristine layers");
    /* the new root, stacked over the pristine bind (a place the agent cannot touch) */
    if (mount("rollbank-vroot", PRISTINE, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"))
        die("mount the verifier's root");
    char path[256], fdp[64];
    snprintf(path, sizeof path, PRISTINE SCRATCH);
    if (mkdir(path, 0755)) die("mkdir scratch");
    snprintf(path, sizeof path, PRISTINE SRC);
    if (mkdir(path, 0755)) die("mkdir pristine bind");
    fd_path(fdp, sizeof fdp, pristine);
    /* not recursive: the new root is stacked on the pristine mount (its child at its root) */
    if (mount(fdp, path, NULL, MS_BIND, NULL)) die("bind the pristine layers");
    assemble(PRISTINE, pristine);
    close(pristine);
    int old = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (old < 0 || chdir(PRISTINE)) die("enter the verifier's root");
    if (syscall(SYS_pivot_root, ".", ".")) die("pivot_root");
    if (umount2(".", MNT_DETACH)) die("detach the agent's root");
    close(old);
    if (chdir("/")) die("chdir /");
    /* the copies of the pristine stack that came in with the agent's /dev */
    while (umount2(PRISTINE, MNT_DETACH) == 0) {}
    for (int i = 0; i < n_deep; i++) pin(deep_pins[i]);
    if (umount2(SRC, MNT_DETACH) || rmdir(SRC)) die("unbind the pristine layers");
}
