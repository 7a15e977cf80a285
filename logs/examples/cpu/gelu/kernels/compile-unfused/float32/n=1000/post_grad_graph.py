TRACED GRAPH
 ===== AFTER POST GRAD =====
 site-packages/torch/fx/_lazy_graph_module.py class <lambda>(torch.nn.Module):
    def forward(self, arg0_1: "f32[1000][1]cpu"):
        # File: ops/gelu.py:218 in <lambda>, code: reference=lambda x, a=_approximate: F.gelu(x, approximate=a),
        mul: "f32[1000][1]cpu" = torch.ops.aten.mul.Tensor(arg0_1, 0.5)
        mul_1: "f32[1000][1]cpu" = torch.ops.aten.mul.Tensor(arg0_1, 0.7071067811865476);  arg0_1 = None
        erf: "f32[1000][1]cpu" = torch.ops.aten.erf.default(mul_1);  mul_1 = None
        add: "f32[1000][1]cpu" = torch.ops.aten.add.Tensor(erf, 1);  erf = None
        mul_2: "f32[1000][1]cpu" = torch.ops.aten.mul.Tensor(mul, add);  mul = add = None
        return (mul_2,)
