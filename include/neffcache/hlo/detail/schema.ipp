// Definitions of hlo/detail/schema.hpp (core/decl.hpp).
#pragma once

#include <neffcache/hlo/detail/schema.hpp>

#include <array>

namespace neffcache::detail::hlo {

NEFFCACHE_DECL MessageSchema make_schema(std::initializer_list<Field> fields) {
  MessageSchema s;
  for (const auto& f : fields) {
    if (f.number >= s.by_number.size()) s.by_number.resize(f.number + 1);
    s.by_number[f.number] = f;
  }
  return s;
}

NEFFCACHE_DECL const MessageSchema& schema_of(Msg m) {
  using K = Kind;
  static const std::array<MessageSchema, static_cast<std::size_t>(Msg::count)> schemas = [] {
    std::array<MessageSchema, static_cast<std::size_t>(Msg::count)> s;
    auto at = [&](Msg x) -> MessageSchema& { return s[static_cast<std::size_t>(x)]; };
    at(Msg::hlo_proto) = make_schema({
        {1, "hlo_module", K::inline_module, Msg::module},
        {3, "buffer_assignment", K::drop},  // compiler output, not input
    });
    at(Msg::module) = make_schema({
        {1, "name", K::drop},
        {2, "entry_computation_name", K::drop},
        {3, "computations", K::message, Msg::computation},
        {4, "host_program_shape", K::message, Msg::program_shape},
        {5, "id", K::drop},  // process-wide counter, differs run to run
        {6, "entry_computation_id", K::comp_id},
        {7, "schedule", K::message, Msg::schedule},
        {8, "input_output_alias"},
        {10, "cross_program_prefetches"},
        {11, "is_dynamic"},
        {12, "spmd_output_sharding", K::message, Msg::op_sharding},
        {13, "profile_info"},
        {14, "spmd_parameters_shardings", K::message, Msg::op_sharding},
        {15, "device_assignment"},
        {16, "use_auto_spmd_partitioning"},
        {17, "stack_frame_index", K::drop},
        {18, "buffer_donor"},
        {19, "frontend_attributes", K::message, Msg::frontend_attributes},
    });
    at(Msg::computation) = make_schema({
        {1, "name", K::drop},
        {2, "instructions", K::message, Msg::instruction},
        {4, "program_shape", K::message, Msg::program_shape},
        {5, "id", K::comp_id},
        {6, "root_id", K::instr_id},
        {7, "is_fusion_computation"},
        {8, "execution_thread", K::string},
    });
    at(Msg::instruction) = make_schema({
        {1, "name", K::drop},
        {2, "opcode", K::string},
        {3, "shape", K::message, Msg::shape},
        {7, "metadata", K::drop},
        {8, "literal", K::message, Msg::literal},
        {9, "parameter_number"},
        {11, "fusion_kind", K::string},
        {13, "tuple_index"},
        {14, "dimensions", K::ints},
        {15, "window"},
        {16, "convolution_dimension_numbers"},
        {17, "slice_dimensions"},
        {18, "exponent_bits"},
        {19, "mantissa_bits"},
        {20, "dynamic_slice_sizes", K::ints},
        {21, "padding_config"},
        {22, "outfeed_config"},
        {23, "distribution"},
        {24, "epsilon"},
        {25, "feature_index"},
        {26, "channel_id"},
        {27, "infeed_config"},
        {28, "custom_call_target", K::string},
        {29, "outfeed_shape", K::message, Msg::shape},
        {30, "dot_dimension_numbers"},
        {31, "fft_type"},
        {32, "fft_length", K::ints},
        {33, "gather_dimension_numbers"},
        {34, "gather_slice_sizes", K::ints},
        {35, "id", K::instr_id},
        {36, "operand_ids", K::instr_ids},
        {37, "control_predecessor_ids", K::instr_ids},
        {38, "called_computation_ids", K::comp_ids},
        {40, "sharding", K::message, Msg::op_sharding},
        {43, "backend_config", K::string},
        {45, "all_reduce_id"},
        {47, "is_host_transfer"},
        {48, "scatter_dimension_numbers"},
        {49, "replica_groups"},
        {50, "feature_group_count"},
        {51, "precision_config"},
        {52, "source_target_pairs"},
        {54, "domain_entry_sharding", K::message, Msg::op_sharding},
        {55, "domain_exit_sharding", K::message, Msg::op_sharding},
        {56, "constrain_layout"},
        {57, "operand_shapes_with_layout", K::message, Msg::shape},
        {58, "batch_group_count"},
        {59, "triangular_solve_options"},
        {60, "is_stable"},
        {61, "parameter_replication"},
        {62, "cholesky_options"},
        {63, "comparison_direction", K::string},
        {65, "custom_call_has_side_effect"},
        {66, "delta"},
        {67, "indices_are_sorted"},
        {68, "frontend_attributes", K::message, Msg::frontend_attributes},
        {69, "unique_indices"},
        {70, "rng_algorithm"},
        {71, "use_global_device_ids"},
        {72, "comparison_type", K::string},
        {73, "is_cross_program_prefetch"},
        {74, "output_operand_aliasing"},
        {75, "padding_type"},
        {76, "custom_call_schedule"},
        {77, "custom_call_api_version"},
        {79, "async_execution_thread", K::string},
        {80, "cross_program_prefetch_index"},
        {81, "k"},
        {82, "statistics_viz", K::drop},
        {85, "largest"},
        {86, "dot_sparsity"},
        {87, "collective_device_list"},
        {88, "original_value"},
        {89, "is_composite"},
        {90, "ragged_dot_dimension_numbers"},
        {91, "result_accuracy"},
    });
    at(Msg::shape) = make_schema({
        {2, "element_type"},
        {3, "dimensions", K::ints},
        {4, "tuple_shapes", K::message, Msg::shape},
        {5, "layout", K::message, Msg::layout},
        {6, "is_dynamic_dimension"},
    });
    at(Msg::layout) = make_schema({
        {1, "minor_to_major", K::ints},
        {10, "physical_shape", K::message, Msg::shape},
    });
    at(Msg::program_shape) = make_schema({
        {1, "parameters", K::message, Msg::shape},
        {2, "result", K::message, Msg::shape},
        {3, "parameter_names", K::drop},
    });
    at(Msg::literal) = make_schema({
        {1, "shape", K::message, Msg::shape},
        {2, "preds"},
        {3, "u8s"},
        {4, "s32s"},
        {5, "s64s"},
        {6, "u32s"},
        {7, "u64s"},
        {8, "f32s"},
        {9, "f64s"},
        {10, "tuple_literals", K::message, Msg::literal},
        {11, "f16s"},
        {12, "c64s"},
        {13, "bf16s"},
        {14, "sparse_indices"},
        {15, "s8s"},
        {16, "u16s"},
        {17, "s16s"},
        {18, "c128s"},
    });
    at(Msg::op_sharding) = make_schema({
        {5, "tuple_shardings", K::message, Msg::op_sharding},
        {7, "metadata", K::drop},
        {14, "named_sharding", K::message, Msg::named_sharding},
    });
    at(Msg::named_sharding) = make_schema({
        {6, "metadata", K::drop},
    });
    at(Msg::schedule) = make_schema({
        {1, "sequences", K::map_entry, Msg::schedule_entry},
    });
    at(Msg::schedule_entry) = make_schema({
        {1, "computation", K::comp_id},
        {2, "sequence", K::message, Msg::instruction_sequence},
    });
    at(Msg::instruction_sequence) = make_schema({
        {1, "instruction_ids", K::instr_ids},
    });
    at(Msg::frontend_attributes) = make_schema({
        {1, "map", K::map_entry, Msg::string_pair},
    });
    at(Msg::string_pair) = make_schema({
        {1, "key", K::string},
        {2, "value", K::string},
    });
    return s;
  }();
  return schemas[static_cast<std::size_t>(m)];
}

}  // namespace neffcache::detail::hlo
