/* rb-helper: shared declarations of its three parts (see rollbank.sandbox.local.helper). */
#ifndef RB_HELPER_H
#define RB_HELPER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/nsfs.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* where every sandbox's pristine layers are bound (under an empty tmpfs; see runtime.py) */
#define PRISTINE "/dev/.rollbank-pristine"

/* main.c: the failure protocol (message on stderr, exit 125) */
void die(const char *what) __attribute__((noreturn));
void die_at(const char *what, const char *path) __attribute__((noreturn));

/* pins.c: the pinned verifier's private view (vexec), in the forked child */
void pin_toolchain(char *pins);

/* userns.c: the id mapping of mapped sandboxes */
void idmap_layer(const char *src, const char *dst, int userns);
void drop_to(unsigned long id);
void full_map_fork(unsigned long id, unsigned long count, int *blk, int *info);
int do_probe(int argc, char **argv);

#endif
