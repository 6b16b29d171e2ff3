// child_process: start this program again as a child (a peer of `swarm local`),
// with its output in a log file, and signal or reap it.
//
// Children get PR_SET_PDEATHSIG, so killing `swarm local` never leaves peers behind.
// The signal follows the *thread* that spawned the child: spawn from a thread that
// lives as long as the child should.
//
//   auto child = swarm::apps::ChildProcess::spawn({"peer", "--stage", "1"}, "run/peers/p1.log");
//   child->signal(SIGSTOP);
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "swarm/core/status.h"

namespace swarm::apps {

class ChildProcess {
 public:
  // Runs /proc/self/exe with `args` and extra `environment` (NAME=VALUE);
  // stdout and stderr go to `log_path`.
  static Result<ChildProcess> spawn(const std::vector<std::string>& args, const std::string& log_path,
                                    const std::vector<std::string>& environment = {});

  pid_t pid() const { return pid_; }
  Status signal(int signal_number) const;
  // True once the process has exited (reaps it without blocking).
  bool exited();
  // Blocks until it exits: its exit code, or 128 + the signal that ended it.
  int wait_for_exit();
  // SIGTERM, then SIGKILL if it has not exited within `grace_seconds`.
  void terminate(double grace_seconds);

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = 128;  // until reaped, or when the code could not be read
};

}  // namespace swarm::apps
