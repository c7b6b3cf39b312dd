#include <sac/cache/statistics.h>

#include <iomanip>
#include <ostream>

namespace sac {

RegionCounts& RegionCounts::operator+=(const RegionCounts& other) {
  forwards += other.forwards;
  calls_seen += other.calls_seen;
  calls_saved += other.calls_saved;
  calls_offloaded += other.calls_offloaded;
  calls_recomputed += other.calls_recomputed;
  calls_demoted += other.calls_demoted;
  tags += other.tags;
  bytes_kept += other.bytes_kept;
  bytes_offloaded += other.bytes_offloaded;
  bytes_dropped += other.bytes_dropped;
  collectives_issued += other.collectives_issued;
  recomputations += other.recomputations;
  calls_served += other.calls_served;
  calls_rerun += other.calls_rerun;
  collectives_reissued += other.collectives_reissued;
  recompute_seconds += other.recompute_seconds;
  return *this;
}

void RegionCounts::print(std::ostream& out) const {
  out << "forward (" << forwards << " regions): " << calls_seen << " calls seen, "
      << calls_saved << " saved, " << calls_offloaded << " offloaded, " << calls_recomputed
      << " recomputed (" << calls_demoted << " demoted), " << tags << " tags\n"
      << "bytes: " << bytes_kept << " kept, " << bytes_offloaded << " offloaded, "
      << bytes_dropped << " dropped\n"
      << "collectives: " << collectives_issued << " issued in forward, "
      << collectives_reissued << " issued again in recomputation\n"
      << "recomputation (" << recomputations << " passes): " << calls_served << " served, "
      << calls_rerun << " rerun, " << std::fixed << std::setprecision(3)
      << recompute_seconds * 1e3 << " ms\n";
}

RegionCounts RegionStatistics::read() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

void RegionStatistics::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_ = RegionCounts();
}

void RegionStatistics::add(const RegionCounts& counts) {
  std::lock_guard<std::mutex> lock(mutex_);
  counts_ += counts;
}

}  // namespace sac
