// A remote-inference client's calls (private to the library): per-episode `seq` numbers,
// re-sending on a fresh connection until answered (docs/protocol.md section 9.9), and the
// episodes a restarted server lost (section 9.8).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "rlserve/connection.hpp"

namespace rlserve {

/// Ids with a value, the oldest forgotten past a bound (a long-running client's memory stays flat).
template <class V>
class RecentMap {
 public:
  explicit RecentMap(std::size_t bound) : bound_(bound) {}
  void put(const std::string& key, V value) {
    if (map_.insert_or_assign(key, std::move(value)).second) order_.push_back(key);
    while (map_.size() > bound_ && !order_.empty()) {
      map_.erase(order_.front());
      order_.pop_front();
    }
    if (order_.size() > 2 * bound_ + 16) {  // drop keys erased since
      std::deque<std::string> kept;
      for (auto& k : order_) {
        if (map_.count(k)) kept.push_back(std::move(k));
      }
      order_.swap(kept);
    }
  }
  const V* get(const std::string& key) const {
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : &it->second;
  }
  bool contains(const std::string& key) const { return map_.count(key) != 0; }
  void erase(const std::string& key) { map_.erase(key); }
  void clear() {
    map_.clear();
    order_.clear();
  }
  const std::unordered_map<std::string, V>& items() const { return map_; }

 private:
  std::size_t bound_;
  std::unordered_map<std::string, V> map_;
  std::deque<std::string> order_;
};

/// Sends calls until answered, each applied once; remembers open, ended and lost episodes.
class RemoteSession {
 public:
  /// `forget` is called when the server restarted (to drop what the client kept for its episodes);
  /// `drop` with an episode that never opened on the server (its pipelined start refused, or
  /// given up: unconfirmed when the connection stayed lost, or not re-sent behind a refused
  /// call), to drop what the client kept for it.
  RemoteSession(Connection& conn, std::function<void()> forget, std::function<void(const std::string&)> drop);

  /// Sends `message` and returns its reply, re-sent over a new connection until answered within
  /// the reconnect timeout; an error reply is returned typed.
  Result<Value> request(Value message);
  /// Sends `message` pipelined: its error, if any, is returned by the next call.
  /// `settle_first` false: behind earlier pipelined calls, not waiting for their replies.
  Status send_nowait(Value message, bool settle_first = true);
  /// episode_lost naming the fix when the server restarted since one of `ids` started.
  Status check_not_lost(const std::vector<std::string>& ids) const;

  /// The `seq` of the episode's next call.
  std::uint64_t next_seq(const std::string& episode_id) const;
  /// The server accepted the episode's call numbered `seq`.
  void accepted(const std::string& episode_id, std::uint64_t seq) { seq_.put(episode_id, seq); }
  /// The server started `episode_id` for this client.
  void started(const std::string& episode_id);
  /// end_episode went out with `seq` (its reply is pipelined).
  void ended(const std::string& episode_id, std::uint64_t seq);
  /// Whether this client started the episode and has not ended it.
  bool is_open(const std::string& episode_id) const { return open_.contains(episode_id); }
  /// How many episodes this client started and has not ended.
  std::size_t open_count() const { return open_.items().size(); }
  /// Settles a pipelined end_episode (re-sent if the connection broke) and disconnects.
  Status close();

 private:
  Result<std::optional<Value>> call(Value message, bool wait, bool settle_first = true);
  bool take_welcome(const Welcome& welcome);
  std::vector<Value> restarted_replay(std::vector<Value> replay);
  /// Undoes the refused pipelined calls (latest first) and returns `e`.
  Error failed(Error e);
  /// Unanswered calls that will not be re-sent (the connection stayed lost, or a call re-sent
  /// before them was refused): the episodes of pipelined starts among them are lost (`reason`).
  void give_up(std::vector<Value>::const_iterator first, std::vector<Value>::const_iterator last, const char* reason);
  void undo_refused(const Value& message);

  Connection& conn_;
  std::function<void()> forget_;
  std::function<void(const std::string&)> drop_;
  std::string instance_id_;
  RecentMap<bool> open_{100000};
  RecentMap<std::string> lost_{100000};
  RecentMap<std::uint64_t> seq_{100000};
  RecentMap<std::uint64_t> ended_seq_{4096};
};

}  // namespace rlserve
