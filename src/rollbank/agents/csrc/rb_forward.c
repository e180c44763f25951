/* rb-forward PORT SOCKET: an in-sandbox agent's one endpoint to its gateway.
 *
 * Listens on 127.0.0.1:PORT inside the sandbox (whose network namespace is loopback only) and
 * relays each connection, byte for byte, to the unix socket SOCKET (the attempt's channel,
 * bound read-only from the host; rollbank's host side relays it to the gateway and nowhere
 * else). Once listening it detaches (the parent exits 0), so `rb-forward ... && agent` starts
 * the agent with the endpoint ready. Built static by rollbank.agents.forward; no libraries. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int relay(int a, int b) {
    char buf[65536];
    struct pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    int open_a = 1, open_b = 1;
    while (open_a || open_b) {
        p[0].fd = open_a ? a : -1;
        p[1].fd = open_b ? b : -1;
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            return 1;
        }
        for (int i = 0; i < 2; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            int from = i ? b : a, to = i ? a : b;
            ssize_t n = read(from, buf, sizeof buf);
            if (n <= 0) {
                shutdown(to, SHUT_WR);
                if (i) open_b = 0; else open_a = 0;
                continue;
            }
            for (ssize_t off = 0; off < n;) {
                ssize_t w = write(to, buf + off, (size_t)(n - off));
                if (w < 0) { if (errno == EINTR) continue; return 1; }
                off += w;
            }
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: rb-forward PORT SOCKET\n"); return 2; }
    struct sockaddr_un un = {0};
    un.sun_family = AF_UNIX;
    if (strlen(argv[2]) >= sizeof un.sun_path) { fprintf(stderr, "socket path too long\n"); return 2; }
    strcpy(un.sun_path, argv[2]);
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in in = {0};
    in.sin_family = AF_INET;
    in.sin_port = htons((unsigned short)atoi(argv[1]));
    in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ls < 0 || bind(ls, (struct sockaddr *)&in, sizeof in) < 0 || listen(ls, 64) < 0) {
        perror("rb-forward: listen");
        return 1;
    }
    pid_t pid = fork();
    if (pid < 0) { perror("rb-forward: fork"); return 1; }
    if (pid > 0) return 0; /* listening: the caller goes on */
    setsid();
    signal(SIGCHLD, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) { dup2(devnull, 0); dup2(devnull, 1); dup2(devnull, 2); }
    for (;;) {
        int c = accept(ls, NULL, NULL);
        if (c < 0) { if (errno == EINTR) continue; return 1; }
        if (fork() == 0) {
            close(ls);
            int u = socket(AF_UNIX, SOCK_STREAM, 0);
            if (u < 0 || connect(u, (struct sockaddr *)&un, sizeof un) < 0) _exit(1);
            _exit(relay(c, u));
        }
        close(c);
    }
}
