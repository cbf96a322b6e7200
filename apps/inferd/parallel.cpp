#include "parallel.h"

#include "common/log.h"
#include "model/model_fingerprint.h"

namespace inferd {

void add_parallel_flags(CLI::App* cmd, ParallelFlags* f) {
  cmd->add_option("--tensor-parallel-size", f->tensor_parallel_size,
                  "split the model's heads and MLP channels across this many MPI ranks (run under "
                  "mpirun -np N; docs/parallelism.md)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--pipeline-parallel-size", f->pipeline_parallel_size,
                  "split the model's layers into this many stages (run under mpirun -np N, N = this times "
                  "--tensor-parallel-size; docs/parallelism.md)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--collective-timeout", f->collective_timeout,
                  "seconds one collective may wait for the other ranks before the job is ended")
      ->check(CLI::PositiveNumber);
}

Expected<std::unique_ptr<Parallel>> Parallel::start(const ParallelFlags& flags) {
  const int ranks = flags.tensor_parallel_size * flags.pipeline_parallel_size;
  const std::string flag = flags.pipeline_parallel_size == 1 ? "--tensor-parallel-size"
                           : flags.tensor_parallel_size == 1
                               ? "--pipeline-parallel-size"
                               : "--tensor-parallel-size × --pipeline-parallel-size";
  if (ranks == 1) {
    if (launched_by_mpi() && std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr &&
        std::string(std::getenv("OMPI_COMM_WORLD_SIZE")) != "1")
      return invalid_argument(
          "started by mpirun with several ranks but --tensor-parallel-size 1: give "
          "--tensor-parallel-size N for mpirun -np N");
    return std::unique_ptr<Parallel>();
  }
  if (!launched_by_mpi())
    return invalid_argument(flag + " " + std::to_string(ranks) + ": run under mpirun -np " +
                            std::to_string(ranks));
  std::unique_ptr<Parallel> p(new Parallel());
  INFERD_ASSIGN_OR_RETURN(p->mpi_, MpiRuntime::init());
  if (p->mpi_->size() != ranks) {
    return invalid_argument("mpirun started " + std::to_string(p->mpi_->size()) + " ranks but " + flag +
                            " is " + std::to_string(ranks));
  }
  p->group_ =
      std::make_unique<MpiTensorGroup>(*p->mpi_, flags.tensor_parallel_size, flags.collective_timeout);
  return p;
}

Parallel::~Parallel() {
  mirror_.reset();  // the workers' stop, before MPI_Finalize
  group_.reset();
}

Status Parallel::split(ModelWeights& weights) {
  INFERD_RETURN_IF_ERROR(group_->check_same_model(model_fingerprint(weights), weights.source_path));
  // The stage's layers first (balanced over the whole model), then the rank's slice of them.
  if (group_->stages() > 1) {
    INFERD_ASSIGN_OR_RETURN(PipelineStage stage,
                            plan_pipeline_stage(weights, group_->stage(), group_->stages()));
    INFERD_RETURN_IF_ERROR(pipeline_weights(weights, stage));
    log_info("pipeline parallel: stage " + std::to_string(stage.stage) + " of " +
                 std::to_string(stage.stages) + " holds its layers",
             {{"layers", std::to_string(stage.layer_begin) + ".." + std::to_string(stage.layer_end)},
              {"weight_bytes", static_cast<int64_t>(weights.weight_bytes)}});
  }
  if (group_->size() == 1) return Status::ok();
  INFERD_ASSIGN_OR_RETURN(TensorShard shard, plan_tensor_shard(weights, group_->rank(), group_->size()));
  INFERD_RETURN_IF_ERROR(shard_weights(weights, shard));
  log_info("tensor parallel: rank " + std::to_string(shard.rank) + " of " + std::to_string(shard.size) +
               " holds its slice",
           {{"stage", static_cast<int64_t>(group_->stage())},
            {"kv_heads", std::to_string(shard.kv_head_begin) + ".." + std::to_string(shard.kv_head_end)},
            {"intermediate", std::to_string(shard.inter_begin) + ".." + std::to_string(shard.inter_end)},
            {"vocab", std::to_string(shard.vocab_begin) + ".." + std::to_string(shard.vocab_end)},
            {"weight_bytes", static_cast<int64_t>(weights.weight_bytes)}});
  return Status::ok();
}

Status Parallel::join(Transformer& model) {
  INFERD_RETURN_IF_ERROR(model.set_tensor_parallel(group_.get()));
  return model.set_pipeline(group_.get());
}

Status Parallel::attach(Transformer& model, EngineOptions& options) {
  INFERD_RETURN_IF_ERROR(join(model));
  int64_t shape[4] = {options.num_kv_blocks, options.block_size, static_cast<int64_t>(options.kv_dtype),
                      options.offload.enabled() ? 1 : 0};
  INFERD_RETURN_IF_ERROR(group_->broadcast(shape));
  mirror_ = std::make_unique<MpiStepMirror>(*group_);
  options.step_mirror = mirror_.get();
  options.kv_shard = KvShard{0, group_->size(), group_->stages()};
  return options.validate();
}

Status Parallel::run_worker(Transformer& model, const KvOffloadOptions& offload) {
  INFERD_RETURN_IF_ERROR(join(model));
  int64_t shape[4] = {0, 0, 0, 0};
  INFERD_RETURN_IF_ERROR(group_->broadcast(shape));
  KvCache cache(model.config().num_layers, shape[0], shape[1], model.config().kv_dim(),
                static_cast<KvDType>(shape[2]), model.config().head_dim);
  std::unique_ptr<KvOffloader> offloader;
  if (shape[3] != 0) {
    const ModelFingerprint fp = model_fingerprint(model.weights());
    const KvShard shard{mpi_->rank(), group_->size(), group_->stages()};
    auto o = offload.enabled()
                 ? KvOffloader::create(offload, cache, kv_shard_fingerprint({fp.lo, fp.hi}, shard))
                 : Expected<std::unique_ptr<KvOffloader>>(
                       invalid_argument("rank 0 has offload tiers, this rank's flags none"));
    if (o) {
      offloader = std::move(*o);
    } else {  // this rank's loads then hold nothing: rank 0 recomputes those blocks
      log_warning("KV offload off on rank " + std::to_string(mpi_->rank()) + ": " + o.status().message());
    }
  }
  MpiWorker worker(*group_, model, cache, offloader.get());
  return worker.run();
}

}  // namespace inferd
