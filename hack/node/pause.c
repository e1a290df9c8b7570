/*
 * The pod sandbox's process for the local cluster's real node (the "pause"
 * image, hack/local-cluster.sh): it holds the pod's namespaces, reaps zombies
 * and exits on SIGINT or SIGTERM. Built statically, so that the image needs
 * nothing else:  gcc -static -Os -o pause hack/node/pause.c
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static void sigdown(int signo) {
  psignal(signo, "pause: shutting down, got signal");
  exit(0);
}

static void sigreap(int signo) {
  (void)signo;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction down = {.sa_handler = sigdown};
  struct sigaction reap = {.sa_handler = sigreap, .sa_flags = SA_NOCLDSTOP};
  if (getpid() != 1) {
    fprintf(stderr, "pause: warning: not the first process of its PID namespace\n");
  }
  if (sigaction(SIGINT, &down, NULL) < 0 || sigaction(SIGTERM, &down, NULL) < 0 ||
      sigaction(SIGCHLD, &reap, NULL) < 0) {
    perror("pause: sigaction");
    return 1;
  }
  for (;;) {
    pause();
  }
}
