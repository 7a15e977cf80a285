TRACED GRAPH
 ===== __compiled_fn_7_b4b520fe_c780_455e_9966_7e75acc3bbad =====
 .venv/lib/python3.11/site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[65537][1]cpu"):
        l_x_ = L_x_

        # File: ops/gelu.py:189 in gelu_erf_unfused, code: return 0.5 * x * (1 + torch.erf(x * 0.7071067811865476))
        mul: "f32[65537][1]cpu" = 0.5 * l_x_
        mul_1: "f32[65537][1]cpu" = l_x_ * 0.7071067811865476;  l_x_ = None
        erf: "f32[65537][1]cpu" = torch.erf(mul_1);  mul_1 = None
        add: "f32[65537][1]cpu" = 1 + erf;  erf = None
        mul_2: "f32[65537][1]cpu" = mul * add;  mul = add = None
        return (mul_2,)
