/* rb-helper: init, exec / vexec, anchor (see rollbank.sandbox.local.helper). */
#include "rb-helper.h"
void die(const char *what) {
    fprintf(stderr, "rb-helper: %s: %s\n", what, strerror(errno));
    _exit(125);
}

void die_at(const char *what, const char *path) {
    fprintf(stderr, "rb-helper: %s %s: %s\n", what, path, strerror(errno));
    _exit(125);
}

static void join_cgroups(int n, char **files) {
    char buf[32];
    int len = snprintf(buf, sizeof buf, "%d\n", (int)getpid());
    for (int i = 0; i < n; i++) {
        int fd = open(files[i], O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, buf, len) != len) die(files[i]);
        close(fd);
    }
}

static void set_limits(const char *nofile, const char *fsize) {
    struct rlimit r = {0, 0};
    if (setrlimit(RLIMIT_CORE, &r)) die("rlimit core");
    r.rlim_cur = r.rlim_max = strtoull(nofile, NULL, 10);
    if (setrlimit(RLIMIT_NOFILE, &r)) die("rlimit nofile");
    r.rlim_cur = r.rlim_max = strtoull(fsize, NULL, 10);
    if (setrlimit(RLIMIT_FSIZE, &r)) die("rlimit fsize");
}

static int do_init(int argc, char **argv) {
    /* init MOUNT_DIR STORAGE_MB OVERLAY_OPTS PRISTINE NOFILE FSIZE MAP N CG... -- ARGV */
    if (argc < 10) { fprintf(stderr, "rb-helper: init: bad arguments\n"); return 125; }
    const char *mdir = argv[2];
    int n = atoi(argv[9]);
    if (argc < 10 + n + 2 || strcmp(argv[10 + n], "--") != 0) {
        fprintf(stderr, "rb-helper: init: bad arguments\n"); return 125;
    }
    if (unshare(CLONE_NEWNS)) die("unshare mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("make / private");
    join_cgroups(n, argv + 10);
    set_limits(argv[6], argv[7]);
    char opts[64], path[4096];
    snprintf(opts, sizeof opts, "size=%sm,mode=0755", argv[3]);
    if (mount("rollbank-upper", mdir, "tmpfs", MS_NOSUID | MS_NODEV, opts)) die("mount tmpfs");
    const char *subs[] = {"upper", "work", "root"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", mdir, subs[i]);
        if (mkdir(path, 0755)) die("mkdir");
    }
    /* MAP: "-", or "ID USERNS_FD STAGE [COUNT]" then (layer, idmapped view) path pairs, one a
       line (USERNS_FD: an inherited descriptor of the user namespace whose map the views use;
       COUNT: the sandbox's ids 0..COUNT-1 are host ID.., see full_map_fork; absent: 0 alone) */
    char *map = strcmp(argv[8], "-") != 0 ? argv[8] : NULL, *stage = NULL;
    unsigned long map_id = 0, map_count = 0;
    if (map) {
        char *save = NULL, *head = strtok_r(map, "\n", &save);
        char *id_s = head ? strtok(head, " ") : NULL, *fd_s = strtok(NULL, " ");
        stage = strtok(NULL, " ");
        char *count_s = strtok(NULL, " ");
        if (count_s) map_count = strtoul(count_s, NULL, 10);
        if (!id_s || !fd_s || !stage) { fprintf(stderr, "rb-helper: init: bad map\n"); return 125; }
        map_id = strtoul(id_s, NULL, 10);
        snprintf(path, sizeof path, "%s/upper", mdir);
        if (chown(path, map_id, map_id)) die("chown upper");  /* the sandbox root's */
        int userns = atoi(fd_s);
        for (char *src; (src = strtok_r(NULL, "\n", &save)) != NULL;) {
            char *dst = strtok_r(NULL, "\n", &save);
            if (!dst) { fprintf(stderr, "rb-helper: init: bad map\n"); return 125; }
            idmap_layer(src, dst, userns);
        }
        close(userns);
        snprintf(path, sizeof path, "%s/root", mdir);
    }
    if (mount("rollbank", path, "overlay", 0, argv[4])) die("mount overlay");
    const char *pristine = argv[5];
    if (strcmp(pristine, "-") != 0) {
        snprintf(path, sizeof path, "%s/pristine", mdir);
        if (mkdir(path, 0755)) die("mkdir pristine");
        if (strchr(pristine, ':') == NULL && strncmp(pristine, "lowerdir=", 9) == 0) {
            if (mount(pristine + 9, path, NULL, MS_BIND | MS_REC, NULL)) die("bind pristine");
            if (mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL))
                die("remount pristine read-only");
        } else if (mount("rollbank-pristine", path, "overlay", MS_RDONLY, pristine)) {
            die("mount pristine overlay");
        }
    }
    if (map) {
        /* bubblewrap runs as the mapped id, which cannot reach MOUNT_DIR (under root's
           home): bind the root and the pristine layers on a tmpfs at STAGE (this private
           mount namespace only) */
        const char *binds[] = {"root", "pristine"};
        int fds[2] = {-1, -1};  /* opened first: MOUNT_DIR may be under STAGE */
        for (int i = 0; i < 2 && (i == 0 || strcmp(pristine, "-") != 0); i++) {
            snprintf(path, sizeof path, "%s/%s", mdir, binds[i]);
            if ((fds[i] = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0) die_at("open", path);
        }
        if (mount("rollbank-stage", stage, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,mode=0755"))
            die_at("mount stage", stage);
        for (int i = 0; i < 2 && fds[i] >= 0; i++) {
            char src[64];
            snprintf(src, sizeof src, "/proc/self/fd/%d", fds[i]);
            snprintf(path, sizeof path, "%s/%s", stage, binds[i]);
            if (mkdir(path, 0755)) die_at("mkdir", path);
            if (mount(src, path, NULL, MS_BIND | MS_REC, NULL)) die_at("bind", path);
            close(fds[i]);
        }
    }
    char **cmd = argv + 10 + n + 1;
    /* The anchor is this very binary, run by bwrap as the sandbox's pid 1 from an inherited
       descriptor (it is not in the sandbox's filesystem): "@ANCHOR@" -> /proc/self/fd/N. */
    static char anchor_path[64];
    int self = open("/proc/self/exe", O_RDONLY);
    if (self < 0) die("open self");
    snprintf(anchor_path, sizeof anchor_path, "/proc/self/fd/%d", self);
    static char blk_s[16] = "-1", info_s[16] = "-1";
    if (map && map_count > 1) {
        int blk, info;
        full_map_fork(map_id, map_count, &blk, &info);
        snprintf(blk_s, sizeof blk_s, "%d", blk);
        snprintf(info_s, sizeof info_s, "%d", info);
    }
    for (char **a = cmd; *a; a++) {
        if (strcmp(*a, "@ANCHOR@") == 0) *a = anchor_path;
        else if (strcmp(*a, "@BLOCKFD@") == 0) *a = blk_s;
        else if (strcmp(*a, "@INFOFD@") == 0) *a = info_s;
    }
    if (map) drop_to(map_id);
    execv(cmd[0], cmd);
    die("exec bwrap");
    return 125;
}

static void drop_caps(unsigned long long keep) {
    if (!keep) return;
    for (int cap = 63; cap >= 0; cap--)
        if (!(keep & (1ULL << cap)) && prctl(PR_CAPBSET_READ, cap, 0, 0, 0) == 1)
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)) die("drop capability");
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d)) die("capget");
    d[0].inheritable = d[1].inheritable = 0;
    if (syscall(SYS_capset, &h, d)) die("capset");
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
}

static int do_exec(int argc, char **argv) {
    /* exec ANCHOR CWD NOFILE FSIZE CAPMASK N CG... -- ARGV
       vexec ANCHOR CWD NOFILE FSIZE CAPMASK PINS N CG... -- ARGV */
    char *pins = NULL;
    if (strcmp(argv[1], "vexec") == 0 && argc > 7) {
        pins = argv[7];
        for (int i = 7; i < argc; i++) argv[i] = argv[i + 1];  /* argv[argc] is NULL */
        argc--;
    }
    if (argc < 9) { fprintf(stderr, "rb-helper: exec: bad arguments\n"); return 125; }
    int anchor = atoi(argv[2]);
    const char *cwd = argv[3];
    unsigned long long keep = strtoull(argv[6], NULL, 16);
    int n = atoi(argv[7]);
    if (argc < 8 + n + 2 || strcmp(argv[8 + n], "--") != 0) {
        fprintf(stderr, "rb-helper: exec: bad arguments\n"); return 125;
    }
    join_cgroups(n, argv + 8);
    set_limits(argv[4], argv[5]);
    char path[64];
    int pidfd = (int)syscall(SYS_pidfd_open, anchor, 0);
    if (pidfd < 0) die("pidfd_open anchor");
    snprintf(path, sizeof path, "/proc/%d/root", anchor);
    int rootfd = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) die("open anchor root");
    /* the pid was not recycled between pidfd_open and open: the pidfd's process still lives */
    if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0)) die("anchor gone");
    if (setgroups(0, NULL)) die("setgroups");  /* no host group follows into the sandbox */
    int flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
                CLONE_NEWPID | CLONE_NEWCGROUP;
    int userfd = -1;
    if (pins) {
        /* The sandbox's user namespace is nested in bwrap's outer one, which owns the mount
           namespace: a private copy made from the nested one would lock every mount (the
           pristine layers could not be uncovered). Build the view as the outer namespace's
           root, then enter the sandbox's own user namespace before running the command. */
        snprintf(path, sizeof path, "/proc/%d/ns/user", anchor);
        userfd = open(path, O_RDONLY | O_CLOEXEC);
        if (userfd < 0) die("open anchor user namespace");
        int outer = ioctl(userfd, NS_GET_PARENT);
        struct stat o, me;
        if (outer < 0 || fstat(outer, &o) || stat("/proc/self/ns/user", &me))
            die("find outer user namespace");
        if (o.st_ino == me.st_ino && o.st_dev == me.st_dev) {
            /* a full-range sandbox: one user namespace (full_map_fork), which owns the mount
               namespace itself: enter it as for any command, the view is made inside it */
            close(userfd);
            userfd = -1;
        } else {
            if (setns(outer, CLONE_NEWUSER)) die("enter outer user namespace");
            flags &= ~CLONE_NEWUSER;
        }
        close(outer);
    }
    if (setns(pidfd, flags)) die("setns");
    close(pidfd);
    /* Mapped sandbox: host root is no id in its user namespace; act as its root (the mapped
       host id; full capabilities in the namespace, none outside). */
    if (geteuid() != 0 && (setresgid(0, 0, 0) || setresuid(0, 0, 0)))
        die("become the sandbox's root");
    if (fchdir(rootfd) || chroot(".")) die("chroot");
    close(rootfd);
    if (chdir(cwd)) {
        fprintf(stderr, "rb-helper: cannot change directory to %s: %s\n", cwd, strerror(errno));
        return 1;
    }
    if (!pins) drop_caps(keep);
    char **cmd = argv + 8 + n + 1;
    pid_t child = fork();
    if (child < 0) die("fork");
    if (child == 0) {
        if (pins) {
            pin_toolchain(pins);
            if (userfd >= 0 && setns(userfd, CLONE_NEWUSER)) die("enter the sandbox's user namespace");
            /* one capability more than the agent's commands (harmless in a user namespace):
               a process the agent left running holds no superset of the verifier's, so the
               kernel refuses it ptrace access (/proc/PID/root into this view, /proc/PID/mem) */
            drop_caps(keep ? keep | (1ULL << CAP_WAKE_ALARM) : 0);
            if (chdir(cwd)) {
                fprintf(stderr, "rb-helper: cannot change directory to %s: %s\n", cwd,
                        strerror(errno));
                _exit(1);
            }
        }
        execvp(cmd[0], cmd);
        fprintf(stderr, "rb-helper: %s: %s\n", cmd[0], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) die("waitpid");
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, sig);
    sigprocmask(SIG_UNBLOCK, &set, NULL);
    kill(getpid(), sig);
    return 128 + sig;
}

static void on_sigchld(int sig) { (void)sig; }

static int do_anchor(int argc, char **argv) __attribute__((noreturn));
static int do_anchor(int argc, char **argv) {
    /* pid 1 of the sandbox: immune to signals from inside its pid namespace (no handler but
       SIGCHLD's), reaps every orphan, holds no descriptor of the host. */
    prctl(PR_SET_NAME, "rollbank-init", 0, 0, 0);
    /* not ptraceable by the sandbox's commands (they lack CAP_SYS_PTRACE): in a mapped
       sandbox the anchor holds no capability, so "fewer capabilities" no longer protects it */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* anchor READY_FD: one byte on the backend's pipe says the sandbox is up (the backend
       waits on it instead of polling /proc); closed below with every other descriptor */
    if (argc > 2 && write(atoi(argv[2]), "1", 1) != 1) _exit(125);
    int null = open("/dev/null", O_RDWR);
    if (null >= 0) { dup2(null, 0); dup2(null, 1); dup2(null, 2); }
    for (int fd = 3; fd < 1024; fd++) close(fd);
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGCHLD);
    sigprocmask(SIG_BLOCK, &block, &old);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigchld;
    sigaction(SIGCHLD, &sa, NULL);
    sigdelset(&old, SIGCHLD);
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0) {}
        sigsuspend(&old);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "anchor") == 0) return do_anchor(argc, argv);
    if (argc > 1 && strcmp(argv[1], "init") == 0) return do_init(argc, argv);
    if (argc > 1 && strcmp(argv[1], "probe") == 0) return do_probe(argc, argv);
    if (argc > 1 && (strcmp(argv[1], "exec") == 0 || strcmp(argv[1], "vexec") == 0))
        return do_exec(argc, argv);
    fprintf(stderr, "usage: rb-helper init|exec ...\n");
    return 125;
}
