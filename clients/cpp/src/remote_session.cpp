// RemoteSession: numbered calls, re-sent until answered; episodes a restarted server lost.
#include "remote_session.hpp"

#include "rlserve/requests.hpp"

namespace rlserve {
namespace {

std::string text_field(const Value& message, const char* key) {
  const Value* v = message.present(key);
  return v != nullptr && v->as_string() != nullptr ? *v->as_string() : std::string();
}

}  // namespace

RemoteSession::RemoteSession(Connection& conn, std::function<void()> forget)
    : conn_(conn), forget_(std::move(forget)), instance_id_(conn.welcome().instance_id) {}

Result<Value> RemoteSession::request(Value message) {
  auto r = call(std::move(message), true);
  if (!r) return r.error();
  return std::move(**r);
}

Status RemoteSession::send_nowait(Value message) {
  auto r = call(std::move(message), false);
  if (!r) return r.error();
  return ok_status();
}

Result<std::optional<Value>> RemoteSession::call(Value message, bool wait) {
  std::optional<Connection::Clock::time_point> deadline;
  std::vector<Value> replay;
  for (;;) {
    std::optional<Error> failure;
    while (!replay.empty() && !failure) {
      auto r = conn_.request(replay.front());
      if (!r) {
        if (!is_connection_failure(r.error())) {
          undo_refused(replay.front());
          return r.error();
        }
        failure = r.error();
        break;
      }
      replay.erase(replay.begin());
    }
    if (!failure) {
      conn_.clear_failed();
      if (wait) {
        auto r = conn_.request(message);
        if (r) return std::optional<Value>(std::move(*r));
        failure = r.error();
      } else {
        auto s = conn_.send_nowait(message);
        if (s) return std::optional<Value>();
        failure = s.error();
      }
    }
    if (!is_connection_failure(*failure)) {
      if (conn_.failed_message()) undo_refused(*conn_.failed_message());  // a refused pipelined end
      return *failure;
    }
    auto unanswered = conn_.take_unanswered();
    replay.insert(replay.begin(), std::make_move_iterator(unanswered.begin()), std::make_move_iterator(unanswered.end()));
    const auto now = Connection::Clock::now();
    if (!deadline) deadline = now + std::chrono::duration_cast<Connection::Clock::duration>(
                                        std::chrono::duration<double>(conn_.options().timeouts.reconnect));
    if (now >= *deadline) return *failure;
    auto welcome = conn_.reconnect(*deadline);
    if (!welcome) return welcome.error();
    if (take_welcome(*welcome)) {
      replay.clear();  // calls of episodes the new server does not know
      if (auto s = check_not_lost(episodes_of(message)); !s) return s.error();
    }
  }
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
  if (text_field(message, "type") != "end_episode") return;
  const std::string id = text_field(message, "episode_id");
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
  conn_.drop();
  return s;
}

}  // namespace rlserve
