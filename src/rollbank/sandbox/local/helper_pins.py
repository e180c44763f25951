"""The pinned-verifier part of ``rb-helper`` (C source, compiled with the helper).

Owns how ``rb-helper vexec`` builds a pinned command's private view (docs/collect.md,
"Verifier isolation"): ``pin_toolchain`` uncovers the pristine layers at ``PRISTINE``, shows
them at each pinned path (``pin``: an overlay with a throw-away tmpfs upper for a directory,
a read-only bind for a file, ``/dev/null`` over what the agent put where the pristine layers
have nothing), makes the ``+/path`` pins fresh private tmpfs mounts (``private_dir``) and
covers every non-directory the agent added at ``/`` (``cover``). Runs in the forked child,
in a fresh mount namespace, before it enters the sandbox's own user namespace.
"""

from __future__ import annotations

SOURCE = r"""
static void cover(const char *target) {
    /* /dev/null over a non-directory (a symlink itself, through an O_PATH descriptor) */
    char fdp[64];
    int fd = open(target, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return;
    snprintf(fdp, sizeof fdp, "/proc/self/fd/%d", fd);
    if (mount("/dev/null", fdp, NULL, MS_BIND, NULL)) die("cover");
    close(fd);
}

static void private_dir(const char *p) {
    /* "+/path": a fresh tmpfs only this command sees (the directory is made if missing) */
    char d[1024];
    snprintf(d, sizeof d, "%s", p);
    for (char *c = d + 1; *c; c++)
        if (*c == '/') { *c = 0; mkdir(d, 0755); *c = '/'; }
    mkdir(d, 0755);
    if (mount("rollbank-private", d, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755"))
        die("private tmpfs");
}

static void pin(const char *p) {
    char src[1024], opts[4096];
    struct stat ps, as;
    snprintf(src, sizeof src, PRISTINE "%s", p);
    int have = lstat(p, &as) == 0;
    if (lstat(src, &ps) != 0) {  /* not in the pristine layers: hide what the agent put there */
        if (have && !S_ISDIR(as.st_mode)) cover(p);
        return;
    }
    if (!have) return;
    if (S_ISDIR(ps.st_mode) != S_ISDIR(as.st_mode)) {
        fprintf(stderr, "rollbank: the verifier's toolchain path %s was replaced in the "
                "sandbox\n", p);
        _exit(126);
    }
    if (!S_ISDIR(ps.st_mode)) {
        if (S_ISLNK(as.st_mode) || S_ISLNK(ps.st_mode)) { cover(p); return; }
        if (mount(src, p, NULL, MS_BIND, NULL)) die("bind pinned file");
        if (mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL)) die("remount pin");
        return;
    }
    /* a throw-away tmpfs holds the upper layer; the overlay goes on top of it */
    if (mount("rollbank-pin", p, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755")) die("pin tmpfs");
    char up[1100], wk[1100];
    snprintf(up, sizeof up, "%s/.u", p);
    snprintf(wk, sizeof wk, "%s/.w", p);
    if (mkdir(up, 0755) || mkdir(wk, 0755)) die("pin dirs");
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=%s,workdir=%s,userxattr", src, up, wk);
    if (mount("rollbank-pin", p, "overlay", 0, opts)) die("pin overlay");
}

static void pin_toolchain(char *pins) {
    /* in the forked child (its /proc/self is the sandbox's), before exec */
    if (unshare(CLONE_NEWNS)) die("unshare verifier mount namespace");
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)) die("make / private");
    if (umount2(PRISTINE, MNT_DETACH)) die("uncover pristine layers");
    char *privates[16];
    int np = 0;
    for (char *p = strtok(pins, "\n"); p; p = strtok(NULL, "\n")) {
        if (p[0] == '/') pin(p);
        else if (p[0] == '+' && np < 16) privates[np++] = p + 1;
    }
    for (int i = 0; i < np; i++) private_dir(privates[i]);
    DIR *root = opendir("/");
    if (!root) die("opendir /");
    struct dirent *e;
    char path[512], src[600];
    struct stat st;
    while ((e = readdir(root)) != NULL) {  /* files the agent added at / (pytest.ini...) */
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "/%s", e->d_name);
        snprintf(src, sizeof src, PRISTINE "/%s", e->d_name);
        if (lstat(path, &st) || S_ISDIR(st.st_mode) || lstat(src, &st) == 0) continue;
        cover(path);
    }
    closedir(root);
}

"""
