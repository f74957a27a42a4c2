// RemoteSession: numbered calls, re-sent until answered; episodes a restarted server lost.
#include "remote_session.hpp"

#include <set>

#include "rlserve/requests.hpp"

namespace rlserve {
namespace {

std::string text_field(const Value& message, const char* key) {
  const Value* v = message.present(key);
  return v != nullptr && v->as_string() != nullptr ? *v->as_string() : std::string();
}

const char* const kUnconfirmed =
    "its start_episode was sent without waiting and the connection was lost before the server confirmed it";
const char* const kNotResent =
    "its start_episode was sent without waiting and, after the connection was lost, a call re-sent before it was "
    "refused, so it was not re-sent";

}  // namespace

RemoteSession::RemoteSession(Connection& conn, std::function<void()> forget,
                             std::function<void(const std::string&)> drop)
    : conn_(conn), forget_(std::move(forget)), drop_(std::move(drop)), instance_id_(conn.welcome().instance_id) {}

Result<Value> RemoteSession::request(Value message) {
  auto r = call(std::move(message), true);
  if (!r) return r.error();
  return std::move(**r);
}

Status RemoteSession::send_nowait(Value message, bool settle_first) {
  auto r = call(std::move(message), false, settle_first);
  if (!r) return r.error();
  return ok_status();
}

Result<std::optional<Value>> RemoteSession::call(Value message, bool wait, bool settle_first) {
  std::optional<Connection::Clock::time_point> deadline;
  std::vector<Value> replay;
  std::set<std::string> unseen;  // pipelined starts a restarted server has never seen
  bool resending = false;         // after a lost connection `message` may have been applied
  bool check_lost = false;        // the server restarted: are this call's episodes gone?
  for (;;) {
    std::optional<Error> failure;
    while (!replay.empty() && !failure) {
      const std::string id = text_field(replay.front(), "episode_id");
      const bool seen = unseen.erase(id) == 0;
      auto r = conn_.request(replay.front(), false);
      if (!r) {
        if (!is_connection_failure(r.error())) {
          // A pipelined start (a fresh random id) the server already knows took effect before
          // the connection broke; the episode may be in use since.
          const bool took_effect = seen && r.error().code == ErrorCode::episode_error &&
                                   text_field(replay.front(), "type") == "start_episode";
          if (!took_effect) {
            undo_refused(replay.front());
            give_up(replay.begin() + 1, replay.end(), kNotResent);
            return failed(r.error());
          }
        } else {
          failure = r.error();
          break;
        }
      }
      replay.erase(replay.begin());
    }
    if (!failure && check_lost) {
      // Only now: the pipelined starts re-sent above are started on the new server.
      check_lost = false;
      if (auto s = check_not_lost(episodes_of(message)); !s) return failed(s.error());
    }
    if (!failure) {
      conn_.clear_failed();
      if (wait) {
        auto r = conn_.request(message, !resending);
        if (r) return std::optional<Value>(std::move(*r));
        failure = r.error();
      } else {
        auto s = conn_.send_nowait(message, settle_first);
        if (s) return std::optional<Value>();
        failure = s.error();
      }
    }
    if (!is_connection_failure(*failure)) return failed(*failure);
    resending = true;
    auto unanswered = conn_.take_unanswered();
    replay.insert(replay.begin(), std::make_move_iterator(unanswered.begin()), std::make_move_iterator(unanswered.end()));
    const auto now = Connection::Clock::now();
    if (!deadline) deadline = now + std::chrono::duration_cast<Connection::Clock::duration>(
                                        std::chrono::duration<double>(conn_.options().timeouts.reconnect));
    if (now >= *deadline) {
      give_up(replay.begin(), replay.end(), kUnconfirmed);
      return failed(*failure);
    }
    auto welcome = conn_.reconnect(*deadline);
    if (!welcome) {
      give_up(replay.begin(), replay.end(), kUnconfirmed);
      return failed(welcome.error());
    }
    if (take_welcome(*welcome)) {
      replay = restarted_replay(std::move(replay));
      unseen.clear();
      for (const Value& m : replay) {
        if (text_field(m, "type") == "start_episode") unseen.insert(text_field(m, "episode_id"));
      }
      check_lost = true;
    }
  }
}

Error RemoteSession::failed(Error e) {
  // Refused pipelined calls, the latest first: an end_episode leaves its episode open, a start
  // never opened one (a refused start and end of one episode leave it unopened).
  auto refused = conn_.take_refused();
  for (auto it = refused.rbegin(); it != refused.rend(); ++it) undo_refused(*it);
  return e;
}

void RemoteSession::give_up(std::vector<Value>::const_iterator first, std::vector<Value>::const_iterator last,
                            const char* reason) {
  // Unanswered calls that will not be re-sent (the connection stayed lost, or a call re-sent
  // before them was refused): episodes whose pipelined start is among them are lost (the server
  // may never have seen them); their calls return episode_lost without a round trip.
  for (auto it = first; it != last; ++it) {
    if (text_field(*it, "type") != "start_episode") continue;
    const std::string id = text_field(*it, "episode_id");
    open_.erase(id);
    drop_(id);
    lost_.put(id, reason);
  }
}

std::vector<Value> RemoteSession::restarted_replay(std::vector<Value> replay) {
  // What a restarted server still takes: the episodes started without waiting, which it has
  // not seen yet, and their ends; the other calls are of episodes it does not know.
  std::set<std::string> fresh, ended;
  for (const Value& m : replay) {
    if (text_field(m, "type") == "start_episode") fresh.insert(text_field(m, "episode_id"));
  }
  std::vector<Value> kept;
  for (Value& m : replay) {
    const std::string id = text_field(m, "episode_id");
    if (fresh.count(id) == 0) continue;
    if (text_field(m, "type") == "end_episode") {
      ended.insert(id);
      // Kept again (the restart cleared them): a refused end leaves the episode going on.
      if (const Value* seq = m.present("seq"); seq != nullptr && seq->as_uint()) ended_seq_.put(id, *seq->as_uint());
    }
    kept.push_back(std::move(m));
  }
  for (const auto& id : fresh) {
    lost_.erase(id);
    if (ended.count(id) == 0) open_.put(id, true);
  }
  return kept;
}

bool RemoteSession::take_welcome(const Welcome& welcome) {
  if (welcome.instance_id == instance_id_) return false;
  instance_id_ = welcome.instance_id;
  const std::string reason = "the server restarted since it started and no longer knows it";
  for (const auto& [id, _] : open_.items()) lost_.put(id, reason);
  for (const auto& [id, _] : seq_.items()) lost_.put(id, reason);
  open_.clear();
  seq_.clear();
  ended_seq_.clear();
  forget_();
  return true;
}

void RemoteSession::undo_refused(const Value& message) {
  const std::string id = text_field(message, "episode_id");
  if (text_field(message, "type") == "start_episode") {  // the episode never opened
    open_.erase(id);
    seq_.erase(id);
    ended_seq_.erase(id);
    drop_(id);
    return;
  }
  if (text_field(message, "type") != "end_episode") return;
  const Value* seq = message.present("seq");
  if (seq == nullptr || !seq->as_uint()) return;
  const std::uint64_t n = *seq->as_uint();
  if (const auto* ended = ended_seq_.get(id); ended && *ended == n) {
    ended_seq_.erase(id);
    open_.put(id, true);
    if (n > 1) seq_.put(id, n - 1);
  }
}

Status RemoteSession::check_not_lost(const std::vector<std::string>& ids) const {
  std::string names;
  const std::string* why = nullptr;
  for (const auto& id : ids) {
    if (const auto* reason = lost_.get(id)) {
      names += (names.empty() ? "'" : ", '") + id + "'";
      if (why == nullptr) why = reason;
    }
  }
  if (why == nullptr) return ok_status();
  return make_error(ErrorCode::episode_lost, "episode " + names + " is lost: " + *why +
                                                 "; start a new episode (reset your environment) and carry on");
}

std::uint64_t RemoteSession::next_seq(const std::string& episode_id) const {
  if (const auto* last = seq_.get(episode_id)) return *last + 1;
  if (const auto* ended = ended_seq_.get(episode_id)) return *ended + 1;
  return 1;
}

void RemoteSession::started(const std::string& episode_id) {
  open_.put(episode_id, true);
  lost_.erase(episode_id);
}

void RemoteSession::ended(const std::string& episode_id, std::uint64_t seq) {
  open_.erase(episode_id);
  seq_.erase(episode_id);
  ended_seq_.put(episode_id, seq);
}

Status RemoteSession::close() {
  Status s = ok_status();
  if (conn_.unanswered() > 0) {
    auto r = request(ping_request(0));
    if (!r) s = r.error();
  }
  // Reads what is left (a pipelined start's reply) and returns an error kept from them.
  if (Status closed = conn_.close(); !closed) {
    Error e = failed(closed.error());
    if (s) s = e;
  }
  return s;
}

}  // namespace rlserve
