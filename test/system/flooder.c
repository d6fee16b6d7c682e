/*
 * A fast handshake flooder for test/system/robustness-flood-rate.test.ts, compiled there with gcc
 * at test time (scripts/install-system-deps.sh installs gcc and libc6-dev).
 *
 *   flooder DST_IP DST_PORT RATE SECONDS MESSAGES_FILE SRC_IP...
 *
 * MESSAGES_FILE holds, for each source in order, PER_SOURCE handshake initiations of 148 bytes
 * (made by the test: a correct mac1 for the victim's key, so they stay valid however often they
 * are resent). One UDP socket per source address, connected to DST; RATE datagrams per second in
 * total, round-robin over the sources, each source's share leaving in sendmmsg batches; between
 * batches every socket is drained with recvmmsg and what came back is counted by message type.
 * Half a second after the flood it drains once more, then prints one JSON line with the totals
 * and the achieved rate.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MESSAGE_SIZE 148
#define BATCH 32
#define RECV_BATCH 64

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static unsigned long long received_by_type[5];
static unsigned long long receive_errors;

static void drain(int fd) {
  static unsigned char bufs[RECV_BATCH][256];
  static struct mmsghdr msgs[RECV_BATCH];
  static struct iovec iovs[RECV_BATCH];
  for (;;) {
    for (int i = 0; i < RECV_BATCH; i++) {
      iovs[i].iov_base = bufs[i];
      iovs[i].iov_len = sizeof bufs[i];
      memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
      msgs[i].msg_hdr.msg_iov = &iovs[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(fd, msgs, RECV_BATCH, MSG_DONTWAIT, NULL);
    if (n <= 0) {
      if (n < 0 && errno != EAGAIN && errno != EINTR) receive_errors++;
      return;
    }
    for (int i = 0; i < n; i++) {
      unsigned t = bufs[i][0];
      received_by_type[t <= 4 ? t : 0]++;
    }
    if (n < RECV_BATCH) return;
  }
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: flooder DST_IP DST_PORT RATE SECONDS MESSAGES_FILE SRC_IP...\n");
    return 2;
  }
  const char *dst_ip = argv[1];
  int dst_port = atoi(argv[2]);
  double rate = atof(argv[3]);
  double seconds = atof(argv[4]);
  const char *file = argv[5];
  int sources = argc - 6;

  FILE *f = fopen(file, "rb");
  if (!f) { perror("messages file"); return 1; }
  struct stat st;
  if (fstat(fileno(f), &st) != 0) { perror("stat"); return 1; }
  long per_source = st.st_size / MESSAGE_SIZE / sources;
  if (per_source < 1 || per_source * MESSAGE_SIZE * sources != st.st_size) {
    fprintf(stderr, "messages file: %ld bytes is not a whole number of messages per source\n", (long)st.st_size);
    return 1;
  }
  unsigned char *messages = malloc(st.st_size);
  if (!messages || fread(messages, 1, st.st_size, f) != (size_t)st.st_size) { perror("read"); return 1; }
  fclose(f);

  struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(dst_port) };
  if (inet_pton(AF_INET, dst_ip, &dst.sin_addr) != 1) { fprintf(stderr, "bad DST_IP\n"); return 1; }
  int *fds = calloc(sources, sizeof *fds);
  long *next = calloc(sources, sizeof *next);
  for (int s = 0; s < sources; s++) {
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) { perror("socket"); return 1; }
    int size = 4 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0) setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    struct sockaddr_in src = { .sin_family = AF_INET, .sin_port = 0 };
    if (inet_pton(AF_INET, argv[6 + s], &src.sin_addr) != 1) { fprintf(stderr, "bad SRC_IP %s\n", argv[6 + s]); return 1; }
    if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0) { perror("bind"); return 1; }
    if (connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0) { perror("connect"); return 1; }
    fds[s] = fd;
  }

  static struct mmsghdr msgs[BATCH];
  static struct iovec iovs[BATCH];
  unsigned long long sent = 0, send_errors = 0, send_calls = 0;
  double start = now_s(), end = start + seconds;
  int s = 0;
  for (;;) {
    double t = now_s();
    if (t >= end) break;
    long long due = (long long)((t - start) * rate) - (long long)sent;
    if (due <= 0) {
      for (int k = 0; k < sources; k++) drain(fds[k]);
      struct timespec pause = { 0, 200000 };
      nanosleep(&pause, NULL);
      continue;
    }
    /* One pass over the sources, each with its share of what is due (at least one). */
    long long share = due / sources + 1;
    if (share > BATCH) share = BATCH;
    for (int k = 0; k < sources && due > 0; k++, s = (s + 1) % sources) {
      int n = (int)(share < due ? share : due);
      for (int i = 0; i < n; i++) {
        iovs[i].iov_base = messages + ((long)s * per_source + (next[s] + i) % per_source) * MESSAGE_SIZE;
        iovs[i].iov_len = MESSAGE_SIZE;
        memset(&msgs[i].msg_hdr, 0, sizeof msgs[i].msg_hdr);
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
      }
      int r = sendmmsg(fds[s], msgs, n, MSG_DONTWAIT);
      send_calls++;
      if (r > 0) {
        sent += r;
        next[s] += r;
        due -= r;
      } else if (errno != EAGAIN && errno != EINTR && errno != ECONNREFUSED) {
        send_errors++;
      }
      drain(fds[s]);
    }
  }
  double elapsed = now_s() - start;
  double settle = now_s() + 0.5;
  while (now_s() < settle) {
    for (int k = 0; k < sources; k++) drain(fds[k]);
    struct timespec pause = { 0, 2000000 };
    nanosleep(&pause, NULL);
  }
  printf("{\"sent\":%llu,\"seconds\":%.3f,\"rate\":%.0f,\"sendCalls\":%llu,\"sendErrors\":%llu,"
         "\"cookieReplies\":%llu,\"responses\":%llu,\"otherReplies\":%llu,\"receiveErrors\":%llu,\"sources\":%d,\"perSource\":%ld}\n",
         sent, elapsed, sent / elapsed, send_calls, send_errors, received_by_type[3], received_by_type[2],
         received_by_type[0] + received_by_type[1] + received_by_type[4], receive_errors, sources, per_source);
  return 0;
}
