// any_data_source: a DataSource of any type behind one type, for code that
// chooses its model at run time (the `swarm` program's roles) and so cannot
// name the source's type in TrainingLoop<Trainer, Source>.
//
//   swarm::AnyDataSource source(Points(seed, 32));   // any swarm::DataSource
//   swarm::TrainingLoop<MyTrainer, swarm::AnyDataSource> loop(...);
#pragma once

#include <memory>
#include <utility>

#include "swarm/api/data_source.h"

namespace swarm {

class AnyDataSource {
 public:
  using data_source_concept = data_source_t;

  template <DataSource D>
    requires(!std::same_as<std::remove_cvref_t<D>, AnyDataSource>)
  explicit AnyDataSource(D source) : held_(std::make_unique<Held<D>>(std::move(source))) {}

  // One virtual call per microbatch: nothing beside a stage's forward.
  Result<Microbatch> next() { return held_->next(); }

 private:
  struct Source {
    virtual ~Source() = default;
    virtual Result<Microbatch> next() = 0;
  };
  template <DataSource D>
  struct Held final : Source {
    explicit Held(D s) : source(std::move(s)) {}
    Result<Microbatch> next() override { return source.next(); }
    D source;
  };
  std::unique_ptr<Source> held_;
};

static_assert(DataSource<AnyDataSource>);

}  // namespace swarm
