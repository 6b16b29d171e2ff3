#include "apps/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace swarm::apps {

Result<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& args, const std::string& log_path,
                                         const std::vector<std::string>& environment) {
  const int log = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) return permission_denied("cannot open {}: {}", log_path, std::strerror(errno));
  std::vector<std::string> argv_storage{"swarm"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& arg : argv_storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log);
    return resource_exhausted("fork failed: {}", std::strerror(errno));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);  // the parent died before prctl took effect
    for (const std::string& entry : environment) ::putenv(const_cast<char*>(entry.c_str()));
    ::dup2(log, STDOUT_FILENO);
    ::dup2(log, STDERR_FILENO);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  ::close(log);
  ChildProcess child;
  child.pid_ = pid;
  return child;
}

Status ChildProcess::signal(int signal_number) const {
  if (reaped_) return failed_precondition("process {} has exited", pid_);
  if (::kill(pid_, signal_number) != 0) return internal("kill({}, {}): {}", pid_, signal_number, std::strerror(errno));
  return Status::ok();
}

bool ChildProcess::exited() {
  if (reaped_) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  }
  return reaped_;
}

int ChildProcess::wait_for_exit() {
  if (reaped_) return exit_code_;
  int status = 0;
  while (::waitpid(pid_, &status, 0) != pid_) {
    if (errno != EINTR) return 128;
  }
  reaped_ = true;
  exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return exit_code_;
}

void ChildProcess::terminate(double grace_seconds) {
  if (exited()) return;
  ::kill(pid_, SIGCONT);  // a stopped process cannot act on SIGTERM
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_seconds);
  while (!exited() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!exited()) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    reaped_ = true;
  }
}

}  // namespace swarm::apps
