#include <stdio.h>

static int checksum(const char *path, unsigned long *bytes, uint32_t *sum) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int c;
    *bytes = 0;
    *sum = 0;
    while ((c = fgetc(f)) != EOF) {
        *bytes += 1;
        *sum += (unsigned char)c
    }
    fclose(f);
    return 0;
}

int main(int argc, char **argv) {
    int status = 0;
    for (int i = 1; i < argc; i++) {
        unsigned long n;
        uint32_t s;
        if (checksum(argv[i], &n, &s) != 0) {
            fprintf(stderr, "csum: cannot open %s: %s\n", argv[i], strerror(errno));
            status = 1;
            continue;
        }
        printf("%lu %u %s\n", n, s, argv[i]);
    }
    return status;
}
