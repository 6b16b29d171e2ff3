// swarm: the library in one header, for projects that depend on it (target //:swarm).
//
// The concepts a model, a transport, a registry, a router and a data source
// implement; the runtimes that serve and drive a pipeline (Peer, Trainer,
// TrainingLoop); the policies and parts they are built from; layers to build a
// stage from; and a checker for a user's stage. Transports are separate headers, chosen at compile time:
// transports/inproc/inproc_transport.h, transports/zmq/zmq_transport.h,
// transports/netem/netem_transport.h (the same target brings them).
//
//   #include "swarm/swarm.h"
//   #include "transports/zmq/zmq_transport.h"
//   swarm::Peer<MyStage, swarm::ZmqTransport, swarm::DhtRegistry, swarm::compression::StandardCodecs> peer(...);
#pragma once

#include "swarm/api/backend.h"
#include "swarm/api/codec.h"
#include "swarm/api/data_source.h"
#include "swarm/api/registry.h"
#include "swarm/api/router.h"
#include "swarm/api/stage.h"
#include "swarm/api/transport.h"
#include "swarm/api/updater.h"
#include "swarm/checkpoint/checkpoint.h"
#include "swarm/compression/codecs.h"
#include "swarm/core/status.h"
#include "swarm/core/tensor.h"
#include "swarm/data/batch_sampler.h"
#include "swarm/layers/layers.h"
#include "swarm/peer/peer.h"
#include "swarm/rebalance/rebalancer.h"
#include "swarm/registry/dht_registry.h"
#include "swarm/registry/in_process_registry.h"
#include "swarm/security/certificate.h"
#include "swarm/security/identity.h"
#include "swarm/stages/any_stage.h"
#include "swarm/stages/variant_stage.h"
#include "swarm/testing/stage_check.h"
#include "swarm/trainer/trainer.h"
#include "swarm/trainer/training_loop.h"
#include "swarm/wiring/stochastic_wiring.h"
