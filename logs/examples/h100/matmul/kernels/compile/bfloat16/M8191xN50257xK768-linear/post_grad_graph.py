TRACED GRAPH
 ===== AFTER POST GRAD =====
 site-packages/torch/fx/_lazy_graph_module.py class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "bf16[8191, 768][768, 1]cuda:0", arg1_1: "bf16[768, 50257][1, 768]cuda:0"):
        # No stacktrace found for following nodes
        constant_pad_nd_default: "bf16[8192, 768][768, 1]cuda:0" = torch.ops.aten.constant_pad_nd.default(arg0_1, [0, 0, 0, 1]);  arg0_1 = None
        constant_pad_nd_default_1: "bf16[768, 50264][50264, 1]cuda:0" = torch.ops.aten.constant_pad_nd.default(arg1_1, [0, 7, 0, 0]);  arg1_1 = None
        mm_default: "bf16[8192, 50264][50264, 1]cuda:0" = torch.ops.aten.mm.default(constant_pad_nd_default, constant_pad_nd_default_1);  constant_pad_nd_default = constant_pad_nd_default_1 = None
        slice_tensor: "bf16[8191, 50264][50264, 1]cuda:0" = torch.ops.aten.slice.Tensor(mm_default, 0, 0, -1);  mm_default = None
        slice_tensor_1: "bf16[8191, 50257][50264, 1]cuda:0" = torch.ops.aten.slice.Tensor(slice_tensor, 1, 0, -7);  slice_tensor = None
        return (slice_tensor_1,)
