TRACED GRAPH
 ===== __compiled_fn_5_bc2c39d8_29dd_415f_ae4d_39bbfaa13a5f =====
 .venv/lib/python3.11/site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[65537][1]cpu"):
        l_x_ = L_x_

        # File: ops/gelu.py:227 in <lambda>, code: reference=lambda x, a=_approximate: F.gelu(x, approximate=a),
        gelu: "f32[65537][1]cpu" = torch._C._nn.gelu(l_x_, approximate = 'none');  l_x_ = None
        return (gelu,)
