// LocalClient: connecting, the weights (fetched at the start and refreshed by a thread), and the
// shipper thread that sends report_samples batches until each is answered.
#include <algorithm>
#include <chrono>

#include "numbers.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/local_client.hpp"
#include "rlserve/requests.hpp"

namespace rlserve {
namespace {

using Clock = Connection::Clock;

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

constexpr std::size_t kMaxSummariesPerBatch = 1000;
constexpr std::size_t kFrameReserve = 4096;  // the message's fields around the fragments

}  // namespace

Status LocalClient::start(const std::string& address) {
  auto parsed = parse_addresses(address);
  if (!parsed) return parsed.error();
  weights_conn_ = std::make_unique<Connection>(*parsed, options_);
  auto welcome = weights_conn_->open();
  if (!welcome) return welcome.error();
  const Value* policy = welcome->policies.present(options_.policy_id);
  if (policy == nullptr) {
    return make_error(ErrorCode::episode_error, "the server serves no policy '" + options_.policy_id +
                                                    "'; pick one of its welcome's policies");
  }
  const Value* obs = policy->present("observation_space");
  const Value* act = policy->present("action_space");
  if (obs == nullptr || act == nullptr) {
    return make_error(ErrorCode::decode_error, "the server's welcome gives no observation_space or action_space");
  }
  auto obs_space = parse_space(*obs);
  if (!obs_space) return obs_space.error();
  auto act_space = parse_space(*act);
  if (!act_space) return act_space.error();
  observation_space_ = std::move(*obs_space);
  action_space_ = std::move(*act_space);
  limits_ = welcome->limits;
  welcome_ = *welcome;
  auto version = fetch_weights(options_.timeouts.reconnect);
  if (!version) return version.error();
  const Model& model = policy_->model();
  if (model.obs_dim() != observation_space_.flat_dim()) {
    return make_error(ErrorCode::decode_error, "the model reads " + std::to_string(model.obs_dim()) +
                                                   " numbers but the observation space flattens to " +
                                                   std::to_string(observation_space_.flat_dim()));
  }
  action_columns_ = model.head().columns();
  if (action_columns_ != number_count(action_space_)) {  // one column per number of the action, in the same order
    return make_error(ErrorCode::unsupported_model, "the model's " + std::to_string(action_columns_) + " action columns do not " +
                                                        "fit the action space " + action_space_.describe() +
                                                        "; connect a Client (remote inference)");
  }
  // A fragment must fit one report: lower its length to the server's limits.
  const std::size_t d = std::max<std::size_t>(1, model.obs_dim()), a = std::max<std::size_t>(1, action_columns_);
  const std::size_t by_elements = std::min(limits_.max_array_elements / d - 1, limits_.max_array_elements / a);
  const std::size_t budget = static_cast<std::size_t>(static_cast<double>(limits_.max_frame_bytes) * 0.9) - kFrameReserve;
  const std::size_t by_bytes = budget / (4 * d + 8 * a + 32 + 8 * model.state_size());
  options_.fragment_length = std::max<std::size_t>(1, std::min({options_.fragment_length, by_elements, by_bytes}));
  report_conn_ = std::make_unique<Connection>(*parsed, options_);
  if (auto w = report_conn_->open(); !w) return w.error();
  shipper_ = std::thread([this] { ship_loop(); });
  refresher_ = std::thread([this] { refresh_loop(); });
  return ok_status();
}

Result<std::uint64_t> LocalClient::fetch_weights(double reconnect_s) {
  std::lock_guard<std::mutex> wlock(weights_mutex_);
  std::optional<std::uint64_t> have;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (policy_) have = policy_->version();
  }
  auto reply = weights_conn_->request(get_weights_request(0, options_.policy_id, have));
  if (!reply && is_connection_failure(reply.error())) {  // fetching is idempotent: ask again
    auto w = weights_conn_->reconnect(after(reconnect_s));
    if (!w) return w.error();
    if (w->instance_id != weights_instance_) have.reset();  // another server: the whole model
    reply = weights_conn_->request(get_weights_request(0, options_.policy_id, have));
  }
  weights_instance_ = weights_conn_->welcome().instance_id;
  if (!reply) return reply.error();
  const Value* unchanged = reply->present("unchanged");
  if (unchanged != nullptr && unchanged->as_bool() && *unchanged->as_bool()) return *have;
  auto policy = Policy::from_weights(*reply);
  if (!policy) return policy.error();
  std::lock_guard<std::mutex> lock(mutex_);
  if (policy_ && policy->model().state_size() != policy_->model().state_size()) {
    return make_error(ErrorCode::unsupported_model, "the new weights change the policy's memory size; reconnect");
  }
  policy_ = std::make_shared<const Policy>(std::move(*policy));
  ++counts_.weights_fetches;
  return policy_->version();
}

Result<std::uint64_t> LocalClient::refresh_weights() { return fetch_weights(options_.timeouts.reconnect); }

void LocalClient::refresh_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    auto due = [this] { return stopping_ || refresh_due_; };
    if (options_.update_interval > 0) {
      changed_.wait_for(lock, std::chrono::duration<double>(options_.update_interval), due);
    } else {
      changed_.wait(lock, due);
    }
    if (stopping_) break;
    refresh_due_ = false;
    lock.unlock();
    fetch_weights(2.0);  // a failure (the server down) is tried again at the next interval
    lock.lock();
  }
}

// Called with mutex_ held: the ready fragments and summaries into batches with fresh ids.
void LocalClient::form_batches(bool all) {
  if (!all && ready_total_ < options_.batch_steps) return;
  if (ready_fragments_.empty() && ready_summaries_.empty()) return;
  auto batches = make_batches(std::move(ready_fragments_), std::move(ready_steps_), std::move(ready_summaries_));
  ready_fragments_.clear();
  ready_steps_.clear();
  ready_summaries_.clear();
  ready_total_ = 0;
  for (auto& b : batches) outbox_.push_back(std::move(b));
}

std::vector<LocalClient::Batch> LocalClient::make_batches(std::vector<Value> fragments, std::vector<std::uint64_t> steps,
                                                          std::vector<Value> summaries) const {
  // Groups of fragments up to batch_steps; a group over the frame limit is halved.
  std::vector<std::pair<std::size_t, std::size_t>> groups;  // [begin, end)
  for (std::size_t i = 0; i < fragments.size();) {
    std::size_t j = i;
    std::uint64_t n = 0;
    while (j < fragments.size() && (j == i || n + steps[j] <= options_.batch_steps)) n += steps[j++];
    groups.emplace_back(i, j);
    i = j;
  }
  if (groups.empty()) groups.emplace_back(0, 0);
  std::vector<Batch> out;
  const auto limit = static_cast<std::size_t>(static_cast<double>(limits_.max_frame_bytes) * 0.95);
  std::size_t summary = 0;
  while (!groups.empty()) {
    auto [begin, end] = groups.front();
    groups.erase(groups.begin());
    Batch b;
    b.batch_id = random_hex_id();
    Value::Array frags, eps;
    for (std::size_t k = begin; k < end; ++k) {
      frags.push_back(fragments[k]);
      b.steps += steps[k];
    }
    const bool last = groups.empty();
    const std::size_t take = std::min(kMaxSummariesPerBatch, summaries.size() - summary);
    for (std::size_t k = 0; k < take; ++k) eps.push_back(summaries[summary + k]);
    b.message = make_message(MessageType::report_samples, 0,
                             {{"batch_id", b.batch_id}, {"policy_id", options_.policy_id},
                              {"fragments", Value(std::move(frags))}, {"episodes", Value(eps)}});
    if (end - begin > 1 && encode(b.message).size() > limit) {
      const std::size_t mid = begin + (end - begin) / 2;
      groups.insert(groups.begin(), {{begin, mid}, {mid, end}});
      continue;
    }
    summary += eps.size();
    if (last && summary < summaries.size()) groups.emplace_back(end, end);  // summaries left over
    if (b.steps > 0 || !eps.empty()) out.push_back(std::move(b));
  }
  return out;
}

Result<Value> LocalClient::send_batch(const Batch& batch, bool drop_reply) {
  for (;;) {
    if (drop_reply) report_conn_->drop_next_reply();
    drop_reply = false;
    auto reply = report_conn_->request(batch.message);
    if (reply || !is_connection_failure(reply.error())) return reply;
    for (;;) {  // the same batch_id again once the server is back: it is trained on once
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return reply.error();
      }
      auto w = report_conn_->reconnect(after(2.0));
      if (w) break;
      if (w.error().code == ErrorCode::invalid_argument) {  // a front-end of another run: wait for a right one
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        continue;
      }
      if (!is_connection_failure(w.error())) return w.error();
    }
  }
}

void LocalClient::ship_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  auto last = Clock::now();
  while (!stopping_) {
    auto work = [this] {
      return stopping_ || !outbox_.empty() || (flushing_ > 0 && (ready_total_ > 0 || !ready_summaries_.empty()));
    };
    changed_.wait_for(lock, std::chrono::duration<double>(options_.flush_interval), work);
    if (stopping_) break;
    if (flushing_ > 0 || Clock::now() - last >= std::chrono::duration<double>(options_.flush_interval)) {
      form_batches(true);
      last = Clock::now();
    }
    if (outbox_.empty()) continue;
    Batch batch = std::move(outbox_.front());
    outbox_.pop_front();
    in_flight_ = true;
    in_flight_steps_ = batch.steps;
    const bool drop = std::exchange(drop_next_reply_, false);
    lock.unlock();
    auto reply = send_batch(batch, drop);
    lock.lock();
    if (reply) {
      ++counts_.batches_sent;
      counts_.steps_shipped += batch.steps;
      const Value* dup = reply->present("duplicate");
      if (dup != nullptr && dup->as_bool() && *dup->as_bool()) ++counts_.duplicates;
      const Value* version = reply->present("weights_version");
      if (version != nullptr && version->as_uint() && policy_ && *version->as_uint() != policy_->version()) {
        refresh_due_ = true;  // the learner moved on: fetch its weights now
      }
    } else if (!stopping_) {
      counts_.steps_refused += batch.steps;
      refused_ = make_error(reply.error().code, "report_samples '" + batch.batch_id + "' was refused (" +
                                                    std::to_string(batch.steps) + " steps): " + reply.error().message);
    } else {
      outbox_.push_front(std::move(batch));  // unshipped: counted as left over by close()
    }
    in_flight_ = false;
    in_flight_steps_ = 0;
    lock.unlock();
    changed_.notify_all();
    lock.lock();
  }
}

Status LocalClient::flush(double timeout_s) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++flushing_;
  changed_.notify_all();
  const bool done = changed_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] {
    return stopping_ || (ready_fragments_.empty() && ready_summaries_.empty() && outbox_.empty() && !in_flight_);
  });
  --flushing_;
  if (done && !stopping_) return ok_status();
  std::uint64_t left = ready_total_ + in_flight_steps_;
  for (const auto& b : outbox_) left += b.steps;
  return make_error(ErrorCode::timeout, std::to_string(left) + " steps are still buffered after " + std::to_string(timeout_s) +
                                            " s: the server at " + report_conn_->address().text() +
                                            " did not answer; start it, or flush again");
}

Status LocalClient::close() {
  Status flushed = flush(options_.timeouts.reconnect);
  stop_threads();
  {
    std::lock_guard<std::mutex> wlock(weights_mutex_);
    if (weights_conn_) weights_conn_->drop();
  }
  if (report_conn_) report_conn_->drop();
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string dropped = std::to_string(counts_.steps_dropped) +
                              " steps were dropped because the buffer was full (max_buffered_steps " +
                              std::to_string(options_.max_buffered_steps) + "); raise it or keep the server reachable";
  if (!flushed) {
    if (counts_.steps_dropped == 0) return flushed;
    return make_error(flushed.error().code, flushed.error().message + "; " + dropped);
  }
  if (refused_) return *refused_;
  if (counts_.steps_dropped > 0) return make_error(ErrorCode::limit_exceeded, dropped);
  return ok_status();
}

void LocalClient::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  // A report or a weights fetch may wait for a server that stopped answering (up to the
  // request timeout per try): cut both connections so the threads return now.
  if (report_conn_) report_conn_->interrupt();
  if (weights_conn_) weights_conn_->interrupt();
  if (shipper_.joinable()) shipper_.join();
  if (refresher_.joinable()) refresher_.join();
}

}  // namespace rlserve
