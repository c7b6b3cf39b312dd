// sac_fuzz: a differential fuzzer for sac.
//
// Each case is a random program over aten ops (generated from a 64-bit seed),
// trained for a few iterations twice: once as plain autograd (the reference)
// and once with random contiguous step ranges wrapped in sac::checkpoint
// regions (nested, selective, with inner backward passes...). Every loss and
// gradient must be bit-identical on CPU; a difference, an unexpected
// exception or a crash is a failure.
//
//   sac_fuzz [--cases N] [--seed S] [--jobs J] [--replay SEED[,SEED...]] [--verbose]
//   env: SAC_DISPATCH (per_op | fallback | auto, inherited by the children),
//        SAC_FUZZ_REGIONS (checkpoint | guard | mixed: regions are
//        sac::checkpoint calls, sac::CheckpointRegion guards, or either, by
//        region; default checkpoint; guards need the fallback key),
//        SAC_FUZZ_CASES (overrides --cases), SAC_FUZZ_SECONDS (run until the
//        time is spent, for long runs), SAC_FUZZ_TIMEOUT (seconds without a
//        result before a child counts as hung; 120), SAC_FUZZ_SKIP (op
//        families not to generate, for triage; see skipped_families).
//   Checks of the harness itself: SAC_FUZZ_TEST_CRASH_SEED,
//   SAC_FUZZ_TEST_SEQUENCE_CRASH_SEED, SAC_FUZZ_TEST_HANG_SEED make a child
//   abort (always, or only after other cases) or hang at that case.
//
// Output: failures as they come (seed, kind, error or first differing
// tensor, a replay command, the program listing), then a summary; the last
// line is "N passed, M failed". Exit status 1 if any case failed.
//
// The parent never runs a case: a crash or a hang in sac must not take the
// tally with it. It re-executes itself (/proc/self/exe --child SEEDS) for
// chunks of cases and reads one result line per case; a chunk that dies is
// re-run one case per process to name the seed.
//
// --replay runs cases in this process with their program listing printed;
// several comma-separated seeds run in sequence in one process, which is how
// a crash that needs earlier cases (process state) is reproduced.

// Note [The fuzzer's files]
// One job each, included in this order (one translation unit):
//   common.h     settings, seeds, string helpers
//   ops.h        the custom op, copy target and Function programs use
//   program.h    a program: its parts, its listing, what it does
//   limits.h     the errors that are sac's documented limits
//   generator.h  programs from a seed
//   runner.h     running a case (plain and checkpointed), the child's loop
//   fuzz.cpp     the parent: processes, chunks, rechecks, the tally

#include "runner.h"

namespace {

// ---- Parent -----------------------------------------------------------------

struct Job {
  std::vector<uint64_t> seeds;
  enum class Kind {
    Chunk,           // a run of cases
    Alone,           // one case of a chunk that died, in a process of its own
    CrashedInChunk,  // the case a chunk was running when it died, alone
    Recheck,         // a case that failed in a chunk, again alone
  } kind = Kind::Chunk;
  // CrashedInChunk, Recheck: what the chunk saw.
  std::vector<uint64_t> before;  // the chunk's cases run before this one
  std::string how;               // how the chunk's child died
  std::string stderr_tail;
  std::string category;
  std::vector<std::string> detail;
};

struct Child {
  pid_t pid = -1;
  int out_fd = -1, err_fd = -1;
  Job job;
  std::string out_buf, err_tail;
  std::vector<std::string> details;
  std::set<uint64_t> finished;
  std::chrono::steady_clock::time_point last_progress;
  bool timed_out = false;
};

struct Tally {
  size_t cases = 0, passed = 0, expected = 0, invalid = 0, failed = 0;
  std::map<std::string, size_t> passed_by, expected_by, invalid_by, failed_by;
  std::vector<uint64_t> failing_seeds;
  std::string mechanism;
};

std::string describe_status(int status, bool timed_out) {
  if (timed_out) {
    return "timeout: no result for " + std::to_string(child_timeout_s()) + " s (hang), killed";
  }
  if (WIFSIGNALED(status)) {
    return "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
           strsignal(WTERMSIG(status)) + ")";
  }
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  return "ended abnormally";
}

// Generating a program runs no op: the parent may do it for a crash report.
void append_listing(uint64_t seed, std::vector<std::string>& detail) {
  const Program program = generate(seed);
  detail.push_back("  features: " + features(program));
  for (const auto& l : split_lines(program.listing())) detail.push_back("  | " + l);
}

class Parent {
 public:
  Parent(uint64_t base_seed, std::optional<size_t> cases, std::optional<double> seconds, int jobs,
         bool verbose)
      : base_seed_(base_seed), cases_(cases), seconds_(seconds), jobs_(jobs), verbose_(verbose) {
    char path[4096];
    const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
    exe_display_ = n > 0 ? std::string(path, n) : "sac_fuzz";
    if (cases_) {
      chunk_ = std::max<size_t>(1, std::min<size_t>(kChunkSize, (*cases_ + jobs_ - 1) / jobs_));
    }
  }

  int run() {
    signal(SIGPIPE, SIG_IGN);
    const auto start = std::chrono::steady_clock::now();
    deadline_ = seconds_ ? start + std::chrono::milliseconds(static_cast<int64_t>(*seconds_ * 1000))
                         : std::chrono::steady_clock::time_point::max();
    std::cout << "sac_fuzz: " << replay_env() << ", seed " << base_seed_ << ", "
              << (seconds_ ? std::to_string(*seconds_) + " s" : std::to_string(*cases_) + " cases")
              << ", " << jobs_ << " jobs, " << exe_display_ << std::endl;
    const auto& names = save_op_names();
    for (const auto& [name, reason] : names.dropped) {
      std::cout << "save_ops candidate dropped: " << name << ": " << one_line(reason, 160) << "\n";
    }
    std::cout << std::flush;

    while (true) {
      while (static_cast<int>(children_.size()) < jobs_) {
        std::optional<Job> job = next_job();
        if (!job) break;
        spawn(std::move(*job));
      }
      if (children_.empty()) break;
      pump();
    }

    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "\n== summary ==\n";
    std::cout << "mechanism: " << (t_.mechanism.empty() ? mechanism_name() : t_.mechanism) << "\n";
    std::cout << "cases: " << t_.cases << " in " << elapsed << " s ("
              << (t_.cases ? 1000.0 * elapsed / t_.cases : 0.0) << " s per 1000 cases, " << jobs_
              << " jobs)\n";
    std::cout << "passed (bit-identical): " << t_.passed << "\n";
    for (const auto& [k, n] : t_.passed_by) std::cout << "  " << k << ": " << n << "\n";
    std::cout << "expected limits: " << t_.expected << "\n";
    for (const auto& [k, n] : t_.expected_by) std::cout << "  " << k << ": " << n << "\n";
    std::cout << "invalid (the reference threw): " << t_.invalid << "\n";
    std::vector<std::pair<size_t, std::string>> reasons;
    for (const auto& [k, n] : t_.invalid_by) reasons.emplace_back(n, k);
    std::sort(reasons.rbegin(), reasons.rend());
    for (size_t i = 0; i < reasons.size() && i < (verbose_ ? reasons.size() : 6); ++i) {
      std::cout << "  " << reasons[i].first << "x " << reasons[i].second << "\n";
    }
    std::cout << "failed: " << t_.failed << "\n";
    for (const auto& [k, n] : t_.failed_by) std::cout << "  " << k << ": " << n << "\n";
    if (!t_.failing_seeds.empty()) {
      std::cout << "failing seeds:";
      for (uint64_t s : t_.failing_seeds) std::cout << " " << s;
      std::cout << "\n";
    }
    std::cout << t_.passed << " passed, " << t_.failed << " failed" << std::endl;
    return t_.failed ? 1 : 0;
  }

 private:
  std::optional<Job> next_job() {
    if (!retries_.empty()) {
      Job job = std::move(retries_.front());
      retries_.pop_front();
      return job;
    }
    const bool more =
        seconds_ ? std::chrono::steady_clock::now() < deadline_ : next_index_ < *cases_;
    if (!more) return std::nullopt;
    Job job;
    const size_t n = seconds_ ? kChunkSize : std::min(chunk_, *cases_ - next_index_);
    for (size_t i = 0; i < n; ++i) job.seeds.push_back(case_seed(base_seed_, next_index_++));
    return job;
  }

  void spawn(Job job) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      perror("sac_fuzz: pipe");
      std::exit(2);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    std::string csv;
    for (uint64_t s : job.seeds) csv += (csv.empty() ? "" : ",") + std::to_string(s);
    std::vector<std::string> args{exe_display_, "--child", csv};
    if (verbose_) args.push_back("--verbose");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    Child child;
    const int rc =
        posix_spawn(&child.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
      std::cerr << "sac_fuzz: posix_spawn failed: " << strerror(rc) << "\n";
      std::exit(2);
    }
    child.out_fd = out[0];
    child.err_fd = err[0];
    child.job = std::move(job);
    child.last_progress = std::chrono::steady_clock::now();
    children_.push_back(std::move(child));
  }

  // Reads what the children wrote, reaps the ones that are done, kills hung ones.
  void pump() {
    std::vector<pollfd> fds;
    for (const auto& c : children_) {
      if (c.out_fd >= 0) fds.push_back({c.out_fd, POLLIN, 0});
      if (c.err_fd >= 0) fds.push_back({c.err_fd, POLLIN, 0});
    }
    if (!fds.empty()) poll(fds.data(), fds.size(), 1000);
    char buf[65536];
    for (auto& c : children_) {
      for (int* fd : {&c.out_fd, &c.err_fd}) {
        if (*fd < 0) continue;
        pollfd p{*fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0) continue;
        const ssize_t n = read(*fd, buf, sizeof(buf));
        if (n <= 0) {
          close(*fd);
          *fd = -1;
          continue;
        }
        if (fd == &c.out_fd) {
          c.out_buf.append(buf, n);
          size_t nl;
          while ((nl = c.out_buf.find('\n')) != std::string::npos) {
            line(c, c.out_buf.substr(0, nl));
            c.out_buf.erase(0, nl + 1);
          }
        } else {
          c.err_tail.append(buf, n);
          if (c.err_tail.size() > 8192) c.err_tail.erase(0, c.err_tail.size() - 8192);
          if (verbose_) std::cerr.write(buf, n);
        }
      }
      const auto idle = std::chrono::steady_clock::now() - c.last_progress;
      if (!c.timed_out && idle > std::chrono::seconds(child_timeout_s())) {
        c.timed_out = true;
        kill(c.pid, SIGKILL);
      }
    }
    for (auto it = children_.begin(); it != children_.end();) {
      if (it->out_fd < 0 && it->err_fd < 0) {
        int status = 0;
        waitpid(it->pid, &status, 0);
        finish(*it, status);
        it = children_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void line(Child& c, const std::string& text) {
    if (text.rfind("@@D ", 0) == 0) {
      c.details.push_back(text.substr(4));
    } else if (text.rfind("@@M ", 0) == 0) {
      t_.mechanism = text.substr(4);
    } else if (text.rfind("@@FATAL ", 0) == 0) {
      std::cout << "sac_fuzz: a child cannot run cases: " << text.substr(8) << std::endl;
      for (const auto& other : children_) kill(other.pid, SIGKILL);
      std::exit(2);
    } else if (text.rfind("@@R ", 0) == 0) {
      std::istringstream in(text.substr(4));
      uint64_t seed = 0;
      std::string kind, category;
      in >> seed >> kind;
      std::getline(in, category);
      if (!category.empty() && category[0] == ' ') category.erase(0, 1);
      c.finished.insert(seed);
      c.last_progress = std::chrono::steady_clock::now();
      result(c.job, seed, kind, category, c.details);
      c.details.clear();
    } else if (verbose_) {
      std::cout << "[child " << c.pid << "] " << text << "\n";
    }
  }

  // The replay of `job`'s case with the chunk's cases before it, in one process.
  static std::string sequence_replay(const Job& job, uint64_t seed) {
    std::string seeds;
    for (uint64_t s : job.before) seeds += std::to_string(s) + ",";
    return "  " + replay_env() + " sac_fuzz --replay " + seeds + std::to_string(seed);
  }

  void result(const Job& job, uint64_t seed, const std::string& kind, const std::string& category,
              const std::vector<std::string>& details) {
    const std::string alone = kind + (category.empty() ? "" : " (" + category + ")");
    if (job.kind == Job::Kind::CrashedInChunk) {
      // The case a chunk died in does not crash alone: the crash needs what
      // the cases before it left in the process.
      std::vector<std::string> detail{"FAILURE seed=" + std::to_string(seed) + " mechanism=" +
                                          mechanism_name() + " kind=crash-in-sequence",
                                      "  the child running this case in a chunk " + job.how +
                                          "; alone, the case's outcome is: " + alone,
                                      "  so it depends on the cases run before it in the same "
                                      "process; replay them in one process:",
                                      sequence_replay(job, seed), "  child stderr (tail):"};
      for (const auto& l : split_lines(first_lines(job.stderr_tail, 25)))
        detail.push_back("    " + l);
      for (const auto& l : details) detail.push_back(l);
      if (details.empty()) append_listing(seed, detail);
      record(seed, CaseOutcome::Fail, "crash-in-sequence", detail);
      return;
    }
    if (job.kind == Job::Kind::Recheck) {
      std::vector<std::string> detail = job.detail;
      if (kind == "fail") {
        detail.insert(detail.begin() + 1, "  reproduces alone in a fresh process");
        record(seed, CaseOutcome::Fail, job.category, detail);
      } else {
        detail.insert(detail.begin() + 1,
                      "  does NOT reproduce alone (alone: " + alone +
                          "): it depends on the cases run before it in the same "
                          "process; replay them in one process:");
        detail.insert(detail.begin() + 2, sequence_replay(job, seed));
        record(seed, CaseOutcome::Fail, job.category + " (in sequence only)", detail);
      }
      return;
    }
    const CaseOutcome::Kind k = kind == "pass"       ? CaseOutcome::Pass
                                : kind == "expected" ? CaseOutcome::Expected
                                : kind == "invalid"  ? CaseOutcome::Invalid
                                                     : CaseOutcome::Fail;
    if (k == CaseOutcome::Fail && job.kind == Job::Kind::Chunk && rechecks_ < kMaxRechecks) {
      // A failure may need what earlier cases left in the process (a policy
      // registered kernels, say): run it again alone to tell.
      ++rechecks_;
      Job recheck;
      recheck.seeds = {seed};
      recheck.kind = Job::Kind::Recheck;
      recheck.before = cases_before(job, seed);
      recheck.category = category;
      recheck.detail = details;
      retries_.push_back(std::move(recheck));
      return;
    }
    record(seed, k, category, details);
  }

  static std::vector<uint64_t> cases_before(const Job& job, uint64_t seed) {
    std::vector<uint64_t> before;
    for (uint64_t s : job.seeds) {
      if (s == seed) break;
      before.push_back(s);
    }
    return before;
  }

  void record(uint64_t seed, CaseOutcome::Kind kind, const std::string& category,
              const std::vector<std::string>& detail) {
    ++t_.cases;
    switch (kind) {
      case CaseOutcome::Pass:
        ++t_.passed;
        if (!category.empty()) ++t_.passed_by[category];
        break;
      case CaseOutcome::Expected:
        ++t_.expected;
        ++t_.expected_by[category];
        break;
      case CaseOutcome::Invalid:
        ++t_.invalid;
        ++t_.invalid_by[category];
        break;
      case CaseOutcome::Fail:
        ++t_.failed;
        ++t_.failed_by[category];
        t_.failing_seeds.push_back(seed);
        for (const auto& l : detail) std::cout << l << "\n";
        std::cout << std::endl;
        break;
    }
    if (verbose_)
      std::cout << "case " << seed << ": " << kind_name(kind) << " " << category << std::endl;
  }

  void finish(Child& c, int status) {
    const bool clean = !c.timed_out && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::vector<uint64_t> unfinished;
    for (uint64_t s : c.job.seeds) {
      if (!c.finished.count(s)) unfinished.push_back(s);
    }
    if (clean && unfinished.empty()) return;
    const std::string how = describe_status(status, c.timed_out);
    if (unfinished.empty()) {
      std::cout << "sac_fuzz: a child " << how << " after its last case\n"
                << first_lines(c.err_tail, 25) << "\n";
      return;
    }
    const uint64_t first = unfinished.front();
    if (c.job.kind != Job::Kind::Chunk) {
      // Alone in its process: this case crashes (or hangs) by itself.
      const std::string kind = c.timed_out ? "timeout" : "crash";
      std::vector<std::string> detail{"FAILURE seed=" + std::to_string(first) +
                                          " mechanism=" + mechanism_name() + " kind=" + kind,
                                      "  the child running this case alone " + how};
      if (c.job.kind == Job::Kind::CrashedInChunk) {
        detail.push_back("  (first seen in a chunk whose child " + c.job.how + ")");
      } else if (c.job.kind == Job::Kind::Recheck) {
        detail.push_back("  (in its chunk it failed without crashing: " + c.job.category + ")");
      }
      detail.push_back("  replay: " + replay_env() + " sac_fuzz --replay " + std::to_string(first));
      detail.push_back("  child stderr (tail):");
      for (const auto& l : split_lines(first_lines(c.err_tail, 25))) detail.push_back("    " + l);
      if (c.job.kind == Job::Kind::Recheck) {
        detail.insert(detail.end(), c.job.detail.begin(), c.job.detail.end());
      } else {
        append_listing(first, detail);
      }
      for (const auto& l : c.details) detail.push_back(l);
      record(first, CaseOutcome::Fail, kind, detail);
      return;
    }
    // Name the crashing case: the one that was running first, alone, with
    // what ran before it remembered; the rest of the chunk one per process.
    Job crashed;
    crashed.seeds = {first};
    crashed.kind = Job::Kind::CrashedInChunk;
    crashed.before = cases_before(c.job, first);
    crashed.how = how;
    crashed.stderr_tail = c.err_tail;
    retries_.push_back(std::move(crashed));
    for (size_t i = 1; i < unfinished.size(); ++i) {
      Job alone;
      alone.seeds = {unfinished[i]};
      alone.kind = Job::Kind::Alone;
      retries_.push_back(std::move(alone));
    }
  }

  uint64_t base_seed_;
  std::optional<size_t> cases_;
  std::optional<double> seconds_;
  int jobs_;
  bool verbose_;
  std::string exe_display_;
  size_t chunk_ = kChunkSize;
  size_t next_index_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::deque<Job> retries_;
  size_t rechecks_ = 0;
  std::vector<Child> children_;
  Tally t_;
};

[[noreturn]] void usage(const std::string& problem) {
  std::cerr
      << "sac_fuzz: " << problem << "\n"
      << "usage: sac_fuzz [--cases N] [--seed S] [--jobs J] [--replay SEED[,SEED...]] [--verbose]\n"
      << "env: SAC_FUZZ_CASES, SAC_FUZZ_SECONDS, SAC_DISPATCH=per_op|fallback|auto\n";
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  size_t cases = 500;
  uint64_t seed = 1;
  int jobs = std::max(1u, std::thread::hardware_concurrency());
  bool verbose = false;
  std::optional<std::string> replay, child;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) usage(arg + " needs a value");
        return argv[++i];
      };
      if (arg == "--cases") cases = std::stoull(value());
      else if (arg == "--seed") seed = std::stoull(value());
      else if (arg == "--jobs") jobs = std::max(1, std::stoi(value()));
      else if (arg == "--replay") replay = value();
      else if (arg == "--child") child = value();
      else if (arg == "--verbose") verbose = true;
      else usage("unknown argument " + arg);
    }
  } catch (const std::logic_error&) {
    usage("bad number");
  }
  if (child) return child_main(parse_seeds(*child), verbose);
  if (replay) {
    try {
      return replay_main(parse_seeds(*replay), verbose);
    } catch (const std::exception& e) {  // a bad SAC_DISPATCH, say
      std::cerr << "sac_fuzz: " << e.what() << "\n";
      return 2;
    }
  }

  std::optional<double> seconds;
  if (const char* env = std::getenv("SAC_FUZZ_CASES")) cases = std::stoull(env);
  if (const char* env = std::getenv("SAC_FUZZ_SECONDS")) seconds = std::stod(env);
  return Parent(seed, seconds ? std::nullopt : std::optional<size_t>(cases), seconds, jobs, verbose)
      .run();
}
