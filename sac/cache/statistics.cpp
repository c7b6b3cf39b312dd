#include <sac/cache/statistics.h>

#include <iomanip>
#include <ostream>

namespace sac {

RegionStatistics::Counts& RegionStatistics::Counts::operator+=(
    const RegionStatistics::Counts& other) {
  forwards += other.forwards;
  calls_seen += other.calls_seen;
  calls_saved += other.calls_saved;
  calls_offloaded += other.calls_offloaded;
  calls_recomputed += other.calls_recomputed;
  calls_demoted += other.calls_demoted;
  tags += other.tags;
  bytes_saved += other.bytes_saved;
  bytes_offloaded += other.bytes_offloaded;
  bytes_dropped += other.bytes_dropped;
  collectives_issued += other.collectives_issued;
  recomputations += other.recomputations;
  calls_served += other.calls_served;
  calls_rerun += other.calls_rerun;
  collectives_reissued += other.collectives_reissued;
  agreements += other.agreements;
  recompute_seconds += other.recompute_seconds;
  return *this;
}

void RegionStatistics::Counts::print(std::ostream& out) const {
  out << "forward (" << forwards << " regions): " << calls_seen << " calls seen, " << calls_saved
      << " saved, " << calls_offloaded << " offloaded, " << calls_recomputed << " recomputed ("
      << calls_demoted << " demoted), " << tags << " tags\n"
      << "bytes: " << bytes_saved << " saved, " << bytes_offloaded << " offloaded, "
      << bytes_dropped << " dropped\n"
      << "collectives: " << collectives_issued << " issued in forward, " << collectives_reissued
      << " issued again in recomputation, " << agreements << " agreements before replays\n"
      << "recomputation (" << recomputations << " passes): " << calls_served << " served, "
      << calls_rerun << " rerun, " << std::fixed << std::setprecision(3) << recompute_seconds * 1e3
      << " ms\n";
}

RegionStatistics::Counts RegionStatistics::read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void RegionStatistics::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_ = RegionStatistics::Counts();
}

void RegionStatistics::add(const RegionStatistics::Counts& counts) {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_ += counts;
}

}  // namespace sac
