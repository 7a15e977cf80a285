TRACED GRAPH
 ===== __compiled_fn_3_39f200b7_3bce_4b82_8859_a48418518011 =====
 .venv/lib/python3.11/site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[1000][1]cpu"):
        l_x_ = L_x_

        # File: ops/gelu.py:189 in gelu_erf_unfused, code: return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))
        mul: "f32[1000][1]cpu" = 0.5 * l_x_
        mul_1: "f32[1000][1]cpu" = l_x_ * 0.7071067811865476;  l_x_ = None
        erf: "f32[1000][1]cpu" = torch.erf(mul_1);  mul_1 = None
        add: "f32[1000][1]cpu" = 1 + erf;  erf = None
        mul_2: "f32[1000][1]cpu" = mul * add;  mul = add = None
        return (mul_2,)
