// Stage 3: parameters sharded too. Each rank keeps its 1/N shard of every group in one 16-bit partition
// (the optimizer's fp32 master is that partition's copy, or the partition itself in fp32). Groups: the persistent
// small parameters (gathered at all times), the root (whatever no unit owns: embeddings, final norm), then one per
// unit (block) in the order given.
//
// One micro-step, as the stage sees it:
//   before_forward      demand the root group (gather it, prefetch what the record says comes next)
//   enter_unit(b)       demand b's group (run_unit(b) = enter, b's forward, leave)
//   leave_unit(b)       hook b's output gradients to demand it again before b's backward; release b unless it is
//                       needed again soon (stage3_max_reuse_distance) or a parameter of it was fetched from outside
//   fetch_param(p)      p read outside its unit: gather its group if it is not, keep it until its gradients are in
//   backward            each parameter's gradient goes into its group's bucket; a group whose gradients are all in
//                       is released and, in descending group order, reduce-scattered into this rank's shard
//   after_backward      reduce what is left, wait, release every non-persistent group
// Frozen parameters (a LoRA fine-tune's base model) are partitioned too, in groups of their own beside their unit's
// (frozen_layout_): gathered and released with it, except that in backward no gradient says when the unit is done
// with them, so they go when every autograd node the unit's forward recorded has run (BackwardWatch).
// Every demand (and boundary) is checked across ranks (OrderCheck: a demand the gather record predicted is compared
// behind; any other demand, and each boundary, waits for the comparison), so ranks that diverge stop with an error
// instead of pairing mismatched collectives.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <stdexcept>
#include <unordered_map>

#include "dscpp/compat/torch_compat.h"
#include "dscpp/offload/host_memory.h"
#include "dscpp/zero/assemble_param.h"
#include "dscpp/zero/backward_watch.h"
#include "dscpp/zero/gather_order.h"
#include "dscpp/zero/gathered_group.h"
#include "dscpp/zero/group_placement.h"
#include "dscpp/zero/in_flight.h"
#include "dscpp/zero/order_check.h"
#include "dscpp/zero/returnable_memory.h"
#include "dscpp/zero/sharded_master.h"
#include "dscpp/zero/zero_stage.h"

namespace dscpp {
namespace {

class Stage3 final : public ZeroStage {
 public:
  Stage3(const StageContext& context, PartitionedModel model, const ZeroConfig& zero)
      : ctx_(context), zero_(zero), placement_(place_groups(model, zero)) {
    order_params(model);
    layout_ = std::make_unique<FlatLayout>(layout_params(names_, params_, kinds_), ctx_.comm->world_size(),
                                           std::numeric_limits<int64_t>::max());
    if (!frozen_.empty()) {
      frozen_layout_ = std::make_unique<FlatLayout>(layout_params(frozen_names_, frozen_, frozen_kinds_),
                                                    ctx_.comm->world_size(), std::numeric_limits<int64_t>::max());
    }
    auto match = match_prepartitioned(params_, kinds_, frozen_, placement_.kind_name.size(), model.prepartitioned);
    prepartitioned_of_kind_ = std::move(match.of_kind);
    regrouped_of_ = std::move(match.regrouped_of);
    regrouped_left_ = std::move(match.regrouped_left);
    const auto& front = params_.empty() ? frozen_.front() : params_.front();
    dtype_ = front.scalar_type();
    device_ = front.device();
    const auto& offload = ctx_.param_offload;
    const auto partition_options = offload.offloaded() ? host_options(offload.pin_memory).dtype(front.scalar_type())
                                                       : front.options().requires_grad(false);
    partition_ = torch::empty({layout_->partition_numel()}, partition_options);
    // Frozen shards: host memory when offload_param offloads, and with nvme the store (move_partition_to_store).
    if (frozen_layout_) frozen_partition_ = torch::empty({frozen_layout_->partition_numel()}, partition_options);
    // The gradient hooks before the groups: a parameter's AccumulateGrad node takes the parameter's shape when it is
    // made (and ours keeps it alive), and from build_groups on a parameter of a released group is 0-element.
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].mutable_grad() = torch::Tensor();
      param_slot_.emplace(params_[i].unsafeGetTensorImpl(), static_cast<int>(i));
      hooks_.push_back(std::make_unique<compat::PostAccumulateGradHook>(params_[i], [this, i] { on_grad_ready(i); }));
    }
    build_groups(model.prepartitioned);
    if (ctx_.quantized_nontrainable_weights) store_frozen_quantized();
    // The model's own parameter storage and any prepartitioned shards are gone, leaving holes in the heap.
    model.prepartitioned.clear();
    trim_heap();
    master_ = std::make_unique<ShardedMaster>(ctx_, *layout_, partition_);
    if (ctx_.param_store) move_partition_to_store();
    std::vector<std::string> group_names;
    for (size_t g = 0; g < groups_.size(); ++g) group_names.push_back(group_name(static_cast<int64_t>(g)));
    check_ = std::make_unique<OrderCheck>(ctx_.comm, std::move(group_names));
    in_flight_ = std::make_unique<InFlight>(ctx_.overlap_comm ? kMaxCollectivesInFlight : 0);
    const size_t n_groups = groups_.size();
    watch_ = std::make_unique<BackwardWatch>([this](int g) { on_unit_backward_done(g); }, static_cast<int>(n_groups));
    used_.assign(n_groups, false);
    pinned_.assign(n_groups, false);
    running_.assign(n_groups, 0);
    remaining_.assign(n_groups, 0);
  }

  int stage() const override { return 3; }

  void before_forward() override {
    if (!in_micro_step_) begin_micro_step();
    if (root_group_ >= 0) demand(root_group_);
  }

  void after_forward(bool will_backward) override {
    // A forward with nothing to differentiate (evaluation) ends here: nothing will come back for the parameters.
    if (in_micro_step_ && !will_backward) {
      release_all();
      order_.end_micro_step();
      in_micro_step_ = false;
    }
  }

  void enter_unit(int unit) override {
    if (unit < 0 || unit >= static_cast<int>(units_.size())) {
      throw std::invalid_argument("ZeRO-3 run_unit: this module is not one of the gather units passed to "
                                  "dscpp::initialize (InitOptions::gather_units)");
    }
    if (!in_micro_step_) {
      throw std::logic_error("ZeRO-3 run_unit(" + units_[unit].name +
                             ") outside the engine's forward: run the model inside engine->forward([&] { ... }) "
                             "(C++) or as engine(inputs) (Python) so the parameters outside the units are gathered "
                             "too");
    }
    const int group = unit_group_[unit];
    if (group < 0) return;  // every parameter of this unit is persistent
    demand(group);
    ++running_[group];
    unit_marks_.push_back(BackwardWatch::mark());
  }

  void leave_unit(int unit, const std::vector<torch::Tensor>& outputs) override {
    const int group = unit >= 0 && unit < static_cast<int>(units_.size()) ? unit_group_[unit] : -1;
    if (group < 0) return;
    if (running_[group] > 0) --running_[group];
    const uint64_t mark = unit_marks_.empty() ? 0 : unit_marks_.back();
    if (!unit_marks_.empty()) unit_marks_.pop_back();
    for (const auto& out : outputs) {
      if (!out.defined() || !out.requires_grad()) continue;
      // Fires when the gradient of the unit's output is complete, i.e. right before the unit's own backward.
      out.register_hook([this, group](const torch::Tensor&) { demand(group); });
    }
    // The unit's frozen parameters are read by these nodes' backward, and by nothing else of it.
    if (const int frozen = frozen_part(group); frozen >= 0) watch_->watch(frozen, outputs, mark);
    if (!pinned_[group]) release_unless_reused(group);
  }

  // Every rank reads the same parameters at the same points, and whether a group is sharded follows from the demands
  // and the record alone, so the gather issued here pairs up across ranks; a gather already in flight (prefetched)
  // is only waited for, which each rank does by itself.
  void fetch_param(const torch::Tensor& param) override {
    if (!in_micro_step_) return;
    const int g = lead_of_param(param);
    if (g < 0 || persistent(g) || running_[g] > 0) return;  // its own unit is running: gathered until it leaves
    if (any_sharded(g)) {
      demand(g);
    } else {
      wait_lead(g);
      used_[g] = true;
    }
    pinned_[g] = true;
  }

  void before_backward() override {
    if (!in_micro_step_) {
      throw std::logic_error("ZeRO-3: engine->backward without engine->forward: run the model inside "
                             "engine->forward([&] { ... }) so its parameters are gathered and the step is tracked");
    }
    in_backward_ = true;
  }

  void after_backward() override {
    in_backward_ = false;
    launch_ready(/*all=*/true);
    in_flight_->drain();
    release_all();
    order_.end_micro_step();
    in_micro_step_ = false;
    ++micro_steps_;
  }

  void reduce_gradients() override {
    // A rank that ran fewer micro-steps than the others arrives here while they gather: say so, on every rank.
    check_->expect_same({OrderPoint::kBoundary, -1, micro_steps_, 0});
    master_->prepare_master_grads();
  }

  const FlatLayout& layout() const override { return *layout_; }
  torch::Tensor& master_params() override { return master_->params(); }
  void release_master() override { master_->release_master(); }
  torch::Tensor& master_grads() override { return master_->master_grads(); }
  torch::Tensor local_grad_sq_norm() override { return master_->local_grad_sq_norm(); }

  // The updated master becomes this rank's 16-bit shard; only the persistent group is gathered now, the others
  // when the next forward needs them.
  void publish_params() override {
    torch::NoGradGuard no_grad;
    if (param_store_) {
      if (trained_groups_ > 0) param_store_->write({{0, 0, master_->params()}});  // else the store is all frozen
    } else if (!master_->params().is_same(partition_)) {
      partition_.copy_(master_->params());
    }
    drop_secondaries();
    regather_persistent();
  }

  // Offloaded: each sub-group's values go straight into the shard (nothing to gather until the next forward).
  void publish_range(int64_t begin, const torch::Tensor& values) override {
    torch::NoGradGuard no_grad;
    if (param_store_) return trained_groups_ > 0 ? param_store_->write({{0, begin, values}}) : void();
    auto target = partition_.narrow(0, begin, values.numel());
    if (target.data_ptr() != values.data_ptr()) target.copy_(values);
  }
  void finish_publish() override {
    drop_secondaries();
    regather_persistent();
  }

  void zero_grads() override { master_->zero_grads(); }

  // One parameter at a time: the persistent ones as they are, every other assembled alone from the ranks'
  // shards, so at most one parameter is ever whole beyond the shards (a model save never holds a whole block).
  void visit_params(const ParamVisitor& fn) override {
    if (in_micro_step_) throw std::logic_error("ZeRO-3 visit_params: called between a forward and its backward");
    for (size_t i = 0; i < params_.size(); ++i) {
      const int group = layout_->slots()[i].group;
      fn(names_[i], persistent(group) ? params_[i] : assemble(static_cast<int>(i)));
    }
  }

  torch::Tensor whole_param(const torch::Tensor& param) override {
    if (in_micro_step_) {
      throw std::logic_error("ZeRO-3: a parameter was gathered whole between a forward and its backward");
    }
    if (auto it = param_slot_.find(param.unsafeGetTensorImpl()); it != param_slot_.end()) {
      const int i = it->second;
      return persistent(layout_->slots()[i].group) ? params_[i] : assemble(i);
    }
    if (auto it = frozen_slot_.find(param.unsafeGetTensorImpl()); it != frozen_slot_.end()) {
      const int i = it->second;
      const int g = trained_groups_ + frozen_layout_->slots()[i].group;
      return persistent(g) ? frozen_[i] : assemble_frozen(i);
    }
    return param;  // not partitioned (an integer buffer-like parameter, one outside the model)
  }

  bool partitions_frozen(const torch::Tensor& param) const override {
    return frozen_slot_.count(param.unsafeGetTensorImpl()) > 0;
  }

  // This rank's part of the value goes into its shard; a gathered group (the persistent one) sees it at once.
  void write_frozen(const torch::Tensor& param, const torch::Tensor& value) override {
    auto it = frozen_slot_.find(param.unsafeGetTensorImpl());
    if (it == frozen_slot_.end()) return ZeroStage::write_frozen(param, value);
    const auto mine = frozen_layout_->fragment_of(it->second, ctx_.comm->rank());
    auto& gathered = write_own_piece(it->second, mine ? value.reshape({-1}).narrow(0, mine->param_begin, mine->numel)
                                                      : torch::Tensor());
    if (gathered.state() != GatheredGroup::State::kSharded) {
      gathered.wait_gathered(*ctx_.comm);
      torch::NoGradGuard no_grad;
      param.copy_(value.reshape(param.sizes()));
    }
  }

  // A partitioned frozen parameter that stays sharded between uses: this rank's elements of it (none: {0, 0}).
  std::optional<std::pair<int64_t, int64_t>> frozen_shard_range(const torch::Tensor& param) const override {
    auto it = frozen_slot_.find(param.unsafeGetTensorImpl());
    if (it == frozen_slot_.end()) return std::nullopt;
    const int g = trained_groups_ + frozen_layout_->slots()[it->second].group;
    if (persistent(g) || groups_[g].state() != GatheredGroup::State::kSharded) return std::nullopt;
    const auto mine = frozen_layout_->fragment_of(it->second, ctx_.comm->rank());
    return mine ? std::make_pair(mine->param_begin, mine->numel) : std::make_pair<int64_t, int64_t>(0, 0);
  }

  void write_frozen_shard(const torch::Tensor& param, const torch::Tensor& values) override {
    if (!frozen_shard_range(param)) throw std::logic_error("ZeRO-3 write_frozen_shard: not a frozen shard");
    write_own_piece(frozen_slot_.at(param.unsafeGetTensorImpl()), values.reshape({-1}));
  }

  StageMemory memory() const override {
    StageMemory m;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (persistent(static_cast<int>(g))) m.persistent += groups_[g].bytes();
    }
    for (int g = trained_groups_; g < static_cast<int>(groups_.size()); ++g) m.frozen += groups_[g].shard_bytes();
    m.params16 = (partition_.defined() ? partition_.nbytes() : 0) + m.frozen + live_bytes(/*persistent_too=*/true);
    m.grads16 = master_->shard_bytes();
    m.master = master_->params().is_same(partition_) ? 0 : master_->master_bytes();
    int64_t largest = 0;
    for (int g = 0; g < trained_groups_; ++g) largest = std::max(largest, groups_[g].bytes());  // buckets
    // Buckets being filled or reduced, and the boundary's fp32 gradient.
    m.buffers = master_->master_grad_bytes() + largest * static_cast<int64_t>(in_flight_->limit() + 2);
    m.gathered_peak = gathered_peak_;
    for (const auto& g : groups_) m.secondary += g.secondary_bytes();
    m.params16 += m.secondary;  // 16-bit copies of parameters this rank holds
    return m;
  }

  StageTimers timers() const override {
    StageTimers t = timers_;
    if (param_store_) t.param_swap = param_store_->stats();
    return t;
  }

 private:
  torch::TensorOptions device_options() const { return torch::TensorOptions().dtype(dtype_).device(device_); }

  // offload_param nvme: every group's shard into the store (its sub-group g: the trainable ones, then the frozen
  // unless they are kept quantized), then the partitions in memory go (the master keeps the trainable one only where
  // it is the master itself: fp32 without offload_optimizer).
  void move_partition_to_store() {
    const bool frozen_too = frozen_partition_.defined() && frozen_partition_.numel() > 0;
    std::vector<int64_t> sizes;
    std::vector<torch::Tensor> initial;
    const FlatLayout* trained = trained_groups_ > 0 ? layout_.get() : nullptr;
    const FlatLayout* frozen = frozen_too ? frozen_layout_.get() : nullptr;
    for (const FlatLayout* layout : {trained, frozen}) {
      if (layout == nullptr) continue;
      for (const auto& g : layout->groups()) sizes.push_back(g.shard_numel);
      initial.push_back(layout == layout_.get() ? partition_ : frozen_partition_);
    }
    if (sizes.empty()) return;  // only quantized frozen shards, kept in memory
    param_store_ = ctx_.param_store(sizes, initial.size() == 1 ? initial.front() : torch::cat(initial));
    for (size_t g = 0; g < sizes.size(); ++g) groups_[g].keep_shard_in(param_store_.get(), static_cast<int>(g));
    partition_ = torch::Tensor();
    if (frozen_too) frozen_partition_ = torch::Tensor();
  }

  // zero_quantized_nontrainable_weights: each frozen group's shard as int8 blocks (the persistent ones stay exact,
  // in memory of their own), and the partition they were views of goes.
  void store_frozen_quantized() {
    for (int g = trained_groups_; g < static_cast<int>(groups_.size()); ++g) {
      if (persistent(g)) {
        groups_[g].own_shard();
      } else {
        groups_[g].store_quantized();
      }
    }
    frozen_partition_ = torch::Tensor();
  }

  // hpZ: the shards changed, so each block's next gather goes over every rank again (the frozen ones did not).
  void drop_secondaries() {
    for (int g = 0; g < trained_groups_; ++g) groups_[g].drop_secondary();
  }

  void regather_persistent() {
    if (persistent_group_ < 0 || is_frozen(persistent_group_)) return;
    auto& g = groups_[persistent_group_];
    g.release();
    g.wait_gathered(*ctx_.comm);
  }

  // Parameters ordered by group kind (persistent, root, units), stable within a kind; the frozen ones apart.
  void order_params(PartitionedModel& model) {
    const size_t kinds = placement_.kind_name.size();
    order_by_kind(model.params, model.names, placement_.kind_of_param, kinds, params_, names_, kinds_);
    order_by_kind(model.frozen, model.frozen_names, placement_.kind_of_frozen, kinds, frozen_, frozen_names_,
                  frozen_kinds_);
    // Frozen alone is a model held for its forward (InitOptions::forward_only, or a model frozen throughout).
    if (params_.empty() && frozen_.empty()) throw std::invalid_argument("ZeRO-3: the model has no parameters");
    units_ = std::move(model.units);
  }

  // Kind 0 is the persistent group: gathered exact (StageContext::quantized_weights).
  GatherWire wire_for(int kind) const {
    return ctx_.quantized_weights && kind != 0 ? GatherWire::kInt8 : GatherWire::kExact;
  }

  // The parameters and layout group `g` of groups_ is made of: layout_'s for the first trained_groups_, then
  // frozen_layout_'s.
  bool is_frozen(int g) const { return g >= trained_groups_; }
  const FlatLayout& layout_of(int g) const { return is_frozen(g) ? *frozen_layout_ : *layout_; }
  const ParamGroup& layout_group(int g) const {
    return layout_of(g).groups()[static_cast<size_t>(is_frozen(g) ? g - trained_groups_ : g)];
  }
  const std::vector<torch::Tensor>& params_of(int g) const { return is_frozen(g) ? frozen_ : params_; }

  // Before a group is built whole: the regrouped units that hold its parameters are gathered (collective; every
  // rank builds the groups in the same order). After: a unit whose parameters have all moved into groups gives its
  // buffer's memory back.
  void gather_regrouped(int g, std::vector<PrepartitionedUnit>& prepartitioned) {
    const auto& group = layout_group(g);
    for (int i = group.param_begin; i < group.param_end; ++i) {
      auto it = regrouped_of_.find(params_of(g)[i].unsafeGetTensorImpl());
      if (it != regrouped_of_.end()) gather_whole(prepartitioned[it->second], *ctx_.comm);
    }
  }
  void release_regrouped(int g, std::vector<PrepartitionedUnit>& prepartitioned) {
    const auto& group = layout_group(g);
    for (int i = group.param_begin; i < group.param_end; ++i) {
      auto it = regrouped_of_.find(params_of(g)[i].unsafeGetTensorImpl());
      if (it != regrouped_of_.end() && --regrouped_left_[it->second] == 0) {
        compat::release_storage(prepartitioned[it->second].buffer);
      }
    }
  }

  // Per group: a buffer filled with rank 0's values, this rank's shard copied out of it, the parameters re-pointed
  // into it, and the buffer released unless persistent. At most one group's buffer exists beyond the model's own
  // parameters, whose storage goes as each is re-pointed. A unit built partitioned brings its released buffer and
  // its shard, which is moved into the partition. Kind by kind, each kind's trained group then its frozen one, so
  // that a regrouped unit is whole only while its own parameters' groups are built.
  void build_groups(std::vector<PrepartitionedUnit>& prepartitioned) {
    torch::NoGradGuard no_grad;
    // An empty layout still has one (padding) group; a model held forward only has no trained groups.
    trained_groups_ = params_.empty() ? 0 : static_cast<int>(layout_->groups().size());
    const int total = trained_groups_ + (frozen_layout_ ? static_cast<int>(frozen_layout_->groups().size()) : 0);
    auto kind_of_group = [&](int g) {
      return is_frozen(g) ? frozen_kinds_[layout_group(g).param_begin] : kinds_[layout_group(g).param_begin];
    };
    std::vector<int> order(static_cast<size_t>(total));
    for (int g = 0; g < total; ++g) order[g] = g;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return kind_of_group(a) < kind_of_group(b); });
    std::map<int, GatheredGroup> built;
    for (int g : order) built.emplace(g, build_group(g, kind_of_group(g), prepartitioned));
    for (auto& [g, group] : built) groups_.push_back(std::move(group));

    // Each kind's lead: its trained group, or its frozen one when it has none; a lead carries its kind's frozen
    // group as its partner. Demands, the gather record and the order check speak of leads.
    std::vector<int> lead_of_kind(placement_.kind_name.size(), -1);
    partner_.assign(static_cast<size_t>(total), -1);
    lead_of_.assign(static_cast<size_t>(total), -1);
    kind_of_group_.assign(static_cast<size_t>(total), -1);
    for (int g = 0; g < total; ++g) {
      const int kind = kind_of_group(g);
      kind_of_group_[g] = kind;
      int& lead = lead_of_kind[kind];
      if (lead < 0) {
        lead = g;
      } else {
        partner_[lead] = g;  // trained groups come first: the lead is the trained one
      }
      lead_of_[g] = lead;
    }
    if (lead_of_kind[0] >= 0) persistent_group_ = lead_of_kind[0];
    if (lead_of_kind.size() > 1 && lead_of_kind[1] >= 0) root_group_ = lead_of_kind[1];
    for (int g = 0; g < total; ++g) {
      const int partner = partner_[g];
      group_numel_.push_back(groups_[g].numel() + (partner >= 0 ? groups_[partner].numel() : 0));
    }
    for (size_t i = 0; i < frozen_.size(); ++i) {
      frozen_slot_.emplace(frozen_[i].unsafeGetTensorImpl(), static_cast<int>(i));
    }
    // Units map to their lead; a unit whose parameters are all persistent (or that has none) maps to -1.
    unit_group_.assign(units_.size(), -1);
    for (size_t u = 0; u < units_.size(); ++u) unit_group_[u] = lead_of_kind[2 + u];
  }

  GatheredGroup build_group(int g, int kind, std::vector<PrepartitionedUnit>& prepartitioned) {
    const int rank = ctx_.comm->rank();
    const auto& layout = layout_of(g);
    const auto& group = layout_group(g);
    const auto& params = params_of(g);
    const std::string name = placement_.kind_name[kind] + (is_frozen(g) ? " (frozen)" : "");
    // qwZ covers the frozen groups too, as DeepSpeed's quantized gathers cover every parameter.
    const GatherWire wire = wire_for(kind);
    if (!is_frozen(g)) {
      if (const int k = prepartitioned_of_kind_[kind]; k >= 0) {
        auto& pre = prepartitioned[k];
        auto shard = partition_.narrow(0, group.partition_offset, group.shard_numel);
        if (pre.buffer.numel() != group.numel || pre.shard.numel() != group.shard_numel ||
            pre.buffer.scalar_type() != partition_.scalar_type()) {
          throw std::invalid_argument("ZeRO-3: unit " + placement_.kind_name[kind] + " was built partitioned for " +
                                      "another world size or dtype than this engine's");
        }
        shard.copy_(pre.shard);
        pre.shard = torch::Tensor();
        GatheredGroup out(name, pre.buffer, shard, GatheredGroup::State::kSharded, wire);
        out.hold(pre.params, pre.views);  // the same parameters in the same order (match_prepartitioned, group_placement.h)
        if (ctx_.hpz_comm && kind != 0) out.keep_secondary_over(ctx_.hpz_comm);
        return out;
      }
    }
    gather_regrouped(g, prepartitioned);
    auto buffer = returnable_zeros(group.numel, device_options());
    for (int i = group.param_begin; i < group.param_end; ++i) {
      const auto& slot = layout.slots()[i];
      buffer.narrow(0, slot.offset - group.offset, slot.numel).copy_(params[i].detach().reshape(-1));
    }
    ctx_.comm->broadcast(buffer, 0).wait();
    auto shard = (is_frozen(g) ? frozen_partition_ : partition_).narrow(0, group.partition_offset, group.shard_numel);
    shard.copy_(buffer.narrow(0, rank * group.shard_numel, group.shard_numel));
    std::vector<torch::Tensor> held, views;
    for (int i = group.param_begin; i < group.param_end; ++i) {
      const auto& slot = layout.slots()[i];
      held.push_back(params[i]);
      views.push_back(buffer.narrow(0, slot.offset - group.offset, slot.numel).view(slot.shape));
    }
    GatheredGroup out(name, buffer, shard, GatheredGroup::State::kGathered, wire);
    out.hold(std::move(held), std::move(views));  // the parameters become views of the buffer
    if (ctx_.hpz_comm && kind != 0) out.keep_secondary_over(ctx_.hpz_comm);
    release_regrouped(g, prepartitioned);
    if (kind != 0) out.release();
    return out;
  }

  // Parameter i of the trainable layout, whole (collective).
  torch::Tensor assemble(int i) {
    return assemble_param(*layout_, i, *ctx_.comm, device_options(), [&](const ShardFragment& f, torch::Tensor out) {
      const int64_t at = layout_->partition_offset(f, ctx_.comm->rank());
      if (param_store_) return param_store_->read(0, at, out);
      out.copy_(partition_.narrow(0, at, f.numel));
    });
  }
  // The same for frozen parameter i, from its group's shard (which may be stored quantized).
  torch::Tensor assemble_frozen(int i) {
    return assemble_param(*frozen_layout_, i, *ctx_.comm, device_options(),
                          [&](const ShardFragment& f, torch::Tensor out) {
                            const int g = trained_groups_ + frozen_layout_->slots()[f.slot].group;
                            groups_[g].read_shard(offset_in_shard(*frozen_layout_, f), out);
                          });
  }
  // Frozen slot `slot`'s elements this rank keeps (`piece`; ignored where it keeps none) into its shard; hpZ's
  // secondary copy, which holds other ranks' parts too, is dropped on every rank. Its group.
  GatheredGroup& write_own_piece(int slot, const torch::Tensor& piece) {
    if (in_micro_step_) throw std::logic_error("ZeRO-3: a frozen parameter was written between a forward and its backward");
    auto& gathered = groups_[trained_groups_ + frozen_layout_->slots()[slot].group];
    if (const auto mine = frozen_layout_->fragment_of(slot, ctx_.comm->rank()); mine && piece.defined()) {
      torch::NoGradGuard no_grad;
      gathered.write_shard(offset_in_shard(*frozen_layout_, *mine), piece);
    }
    gathered.drop_secondary();
    return gathered;
  }

  int64_t offset_in_shard(const FlatLayout& layout, const ShardFragment& f) const {
    const int group = layout.slots()[f.slot].group;
    return layout.partition_offset(f, ctx_.comm->rank()) - layout.groups()[group].partition_offset;
  }

  std::string group_name(int64_t g) const {
    return g >= 0 && g < static_cast<int64_t>(groups_.size()) ? groups_[g].name() : "group " + std::to_string(g);
  }

  bool persistent(int g) const { return kind_of_group_[g] == 0; }

  // A lead group and its frozen partner gather together; they release together too, except in backward, where
  // the trained part goes when its gradients are in and the frozen part when its unit's nodes have run.
  int frozen_part(int lead) const { return is_frozen(lead) ? lead : partner_[lead]; }
  bool any_sharded(int lead) const {
    const int partner = partner_[lead];
    return groups_[lead].state() == GatheredGroup::State::kSharded ||
           (partner >= 0 && groups_[partner].state() == GatheredGroup::State::kSharded);
  }
  bool all_gathered(int lead) const {
    const int partner = partner_[lead];
    return groups_[lead].state() == GatheredGroup::State::kGathered &&
           (partner < 0 || groups_[partner].state() == GatheredGroup::State::kGathered);
  }
  void start_lead(int lead) {
    groups_[lead].start_gather(*ctx_.comm);
    if (const int partner = partner_[lead]; partner >= 0) groups_[partner].start_gather(*ctx_.comm);
  }
  void wait_lead(int lead) {
    start_lead(lead);
    groups_[lead].wait_gathered(*ctx_.comm);
    if (const int partner = partner_[lead]; partner >= 0) groups_[partner].wait_gathered(*ctx_.comm);
  }
  void release_lead(int lead) {
    groups_[lead].release();
    if (const int partner = partner_[lead]; partner >= 0) groups_[partner].release();
  }
  // The lead group of a partitioned parameter (trainable or frozen), or -1.
  int lead_of_param(const torch::Tensor& param) const {
    if (auto it = param_slot_.find(param.unsafeGetTensorImpl()); it != param_slot_.end()) {
      return lead_of_[layout_->slots()[it->second].group];
    }
    if (auto it = frozen_slot_.find(param.unsafeGetTensorImpl()); it != frozen_slot_.end()) {
      return lead_of_[trained_groups_ + frozen_layout_->slots()[it->second].group];
    }
    return -1;
  }

  // Every autograd node a forward of frozen group g's unit recorded has run: its backward is done with them.
  // Called from autograd's thread. A group fetched outside its unit waits for the end of backward.
  void on_unit_backward_done(int g) {
    if (!in_backward_ || persistent(g) || pinned_[lead_of_[g]] || running_[lead_of_[g]] > 0) return;
    groups_[g].release();
  }

  int64_t live_bytes(bool persistent_too) const {
    int64_t total = 0;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (persistent_too || !persistent(static_cast<int>(g))) total += groups_[g].live_bytes();
    }
    return total;
  }

  int64_t live_numel() const {
    int64_t total = 0;
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!persistent(static_cast<int>(g)) && groups_[g].state() != GatheredGroup::State::kSharded) {
        total += groups_[g].numel();
      }
    }
    return total;
  }

  void begin_micro_step() {
    in_micro_step_ = true;
    demands_ = 0;
    order_.begin_micro_step();
    watch_->begin_micro_step();
    unit_marks_.clear();
    for (size_t g = 0; g < groups_.size(); ++g) {
      used_[g] = persistent(static_cast<int>(g));
      pinned_[g] = false;
      running_[g] = 0;
      const auto& group = layout_group(static_cast<int>(g));
      remaining_[g] = is_frozen(static_cast<int>(g)) ? 0 : group.param_end - group.param_begin;  // gradients
    }
    next_launch_ = trained_groups_ - 1;
    buckets_.clear();
  }

  // Group g is needed now: gather it (or wait for its prefetch), then gather ahead what the record says follows.
  void demand(int g) {
    // A demand the record predicted only posts its point: ranks that follow the record issue the same collectives,
    // and the check runs behind. One that departs from the record, or traces a new one, waits until every rank's
    // point is compared, so no rank issues a collective its peers may not: a rank that departs alone stops there,
    // and the others' extra gathers fail once it is gone instead of pairing with anything.
    const bool predicted = order_.demand(g);
    const OrderPoint point{OrderPoint::kDemand, g, micro_steps_, demands_++};
    if (predicted) {
      check_->post(point);
    } else {
      check_->expect_same(point);
    }
    used_[g] = true;
    if (!all_gathered(g)) {
      if (any_sharded(g)) ++timers_.gathers;
      const auto start = std::chrono::steady_clock::now();
      wait_lead(g);
      timers_.gather_wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    gathered_peak_ = std::max(gathered_peak_, live_bytes(/*persistent_too=*/false));
    if (order_.replaying()) prefetch();
  }

  // offload_param nvme: start reading the shards of the next kParamReadAhead groups after those being gathered, so
  // each gather finds its shard in memory. With offload_param.buffer_count's default of 5 that leaves buffers for
  // the gather reading now and for write-backs.
  static constexpr int kParamReadAhead = 2;
  void read_ahead() {
    int hinted = 0;
    for (int g : order_.upcoming()) {
      if (persistent(g) || groups_[g].state() != GatheredGroup::State::kSharded) continue;
      if (hinted++ == kParamReadAhead) break;
      param_store_->prefetch(g);
    }
  }

  // Issues gathers for the next recorded demands, nearest first, while they fit in stage3_prefetch_bucket_size
  // (counting those already in flight) and stage3_max_live_parameters (counting everything gathered).
  void prefetch() {
    int64_t ahead = 0;
    int64_t live = live_numel();
    for (int g : order_.upcoming()) {
      const int64_t numel = group_numel_[g];  // with its frozen partner
      if (persistent(g) || all_gathered(g)) continue;
      if (!any_sharded(g)) {
        ahead += numel;
        continue;
      }
      if (ahead + numel > zero_.stage3_prefetch_bucket_size) break;
      if (live + numel > zero_.stage3_max_live_parameters) break;
      start_lead(g);
      ++timers_.gathers;
      ahead += numel;
      live += numel;
    }
    if (param_store_) read_ahead();
  }

  // After a unit's forward: keep its group gathered only if the record says it is needed again within
  // stage3_max_reuse_distance elements of other gathers, and keeping it stays within stage3_max_live_parameters.
  void release_unless_reused(int g) {
    const auto distance = order_.reuse_distance(g, group_numel_);
    const bool keep = distance && *distance <= zero_.stage3_max_reuse_distance &&
                      live_numel() <= zero_.stage3_max_live_parameters;
    if (!keep) release_lead(g);
  }

  void release_all() {
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!persistent(static_cast<int>(g))) groups_[g].release();
    }
  }

  torch::Tensor& bucket(int g) {
    auto it = buckets_.find(g);
    if (it == buckets_.end()) it = buckets_.emplace(g, returnable_zeros(groups_[g].numel(), device_options())).first;
    return it->second;
  }

  void on_grad_ready(size_t i) {
    if (!in_backward_) {
      throw std::logic_error("ZeRO stage 3 received a gradient outside Engine::backward: call engine->backward(loss) "
                             "instead of loss.backward(), so the loss is scaled and the gradient reduced");
    }
    auto& param = params_[i];
    const auto& slot = layout_->slots()[i];
    const auto& group = layout_->groups()[slot.group];
    bucket(slot.group).narrow(0, slot.offset - group.offset, slot.numel).copy_(param.grad().reshape(-1));
    param.mutable_grad() = torch::Tensor();
    // All of the group's gradients are in, so its backward no longer needs the gathered values (its frozen partner
    // goes when its unit's nodes have run: on_unit_backward_done).
    if (--remaining_[slot.group] == 0 && !persistent(slot.group)) groups_[slot.group].release();
    launch_ready(/*all=*/false);
  }

  // Groups are reduced in descending order, each after every later one, so all ranks issue the same collectives
  // in the same order; a group no rank used this micro-step (a skipped unit) has nothing to reduce.
  void launch_ready(bool all) {
    while (next_launch_ >= 0) {
      const int g = next_launch_;
      if (used_[g]) {
        if (!all && remaining_[g] > 0) return;
        auto grads = std::move(bucket(g));
        buckets_.erase(g);
        in_flight_->push(master_->reduce_group(g, grads), {grads});
      }
      --next_launch_;
    }
  }

  StageContext ctx_;
  ZeroConfig zero_;  // the stage3_* limits
  GroupPlacement placement_;
  std::vector<torch::Tensor> params_;  // in layout order
  std::vector<std::string> names_;
  std::vector<int> kinds_;
  std::vector<int> prepartitioned_of_kind_;  // per kind: index into PartitionedModel::prepartitioned, or -1
  std::unordered_map<const c10::TensorImpl*, int> regrouped_of_;  // a regrouped unit's parameter → that unit
  std::vector<int> regrouped_left_;  // per prepartitioned unit: its parameters not yet in a built group
  std::vector<GatherUnit> units_;
  std::unique_ptr<FlatLayout> layout_;
  // The frozen parameters, in their layout's order, and this rank's shards of them.
  std::vector<torch::Tensor> frozen_;
  std::vector<std::string> frozen_names_;
  std::vector<int> frozen_kinds_;
  std::unique_ptr<FlatLayout> frozen_layout_;  // null without frozen parameters
  torch::Tensor frozen_partition_;
  std::unordered_map<const c10::TensorImpl*, int> frozen_slot_;  // each frozen parameter's slot in frozen_layout_
  int trained_groups_ = 0;         // groups_[0, trained_groups_) are layout_'s groups, the rest frozen_layout_'s
  std::vector<int> partner_;       // per group: the frozen group of the same kind when it leads one, else -1
  std::vector<int> lead_of_;       // per group: the lead of its kind (itself, or the trained group it partners)
  std::vector<int> kind_of_group_;
  std::unique_ptr<BackwardWatch> watch_;  // when a unit's backward is done with its frozen parameters
  std::vector<uint64_t> unit_marks_;      // per unit running: BackwardWatch::mark() at its entry
  torch::Tensor partition_;  // (partition_numel) compute dtype: this rank's shard of every group; none on NVMe
  std::unique_ptr<StateStore> param_store_;  // offload_param nvme: the partition, one sub-group per group shard
  torch::ScalarType dtype_;  // the compute dtype, and where the model computes
  torch::Device device_ = torch::kCPU;
  std::vector<GatheredGroup> groups_;
  std::vector<int64_t> group_numel_;
  std::vector<int> unit_group_;  // per unit: its group, -1 when all its parameters persist (or it has none)
  std::unordered_map<const c10::TensorImpl*, int> param_slot_;  // each partitioned parameter's slot in the layout
  std::vector<bool> pinned_;  // per group: fetched outside its unit this micro-step, kept until its gradients are in
  std::vector<int> running_;  // per group: its unit's forwards entered and not yet left (a unit may call itself)
  int persistent_group_ = -1;
  int root_group_ = -1;
  std::unique_ptr<ShardedMaster> master_;
  std::unique_ptr<OrderCheck> check_;
  std::unique_ptr<InFlight> in_flight_;
  std::vector<std::unique_ptr<compat::PostAccumulateGradHook>> hooks_;
  GatherOrder order_;

  bool in_micro_step_ = false;
  bool in_backward_ = false;
  int64_t micro_steps_ = 0;  // completed forward+backward passes
  int64_t demands_ = 0;      // demands so far this micro-step
  std::vector<bool> used_;   // per group: demanded this micro-step
  std::vector<int> remaining_;
  int next_launch_ = -1;
  std::map<int, torch::Tensor> buckets_;
  int64_t gathered_peak_ = 0;
  StageTimers timers_;
};

}  // namespace

std::unique_ptr<ZeroStage> make_stage3(const StageContext& context, PartitionedModel model, const ZeroConfig& zero) {
  return std::make_unique<Stage3>(context, std::move(model), zero);
}

}  // namespace dscpp
