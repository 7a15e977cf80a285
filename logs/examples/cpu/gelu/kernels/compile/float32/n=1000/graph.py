TRACED GRAPH
 ===== __compiled_fn_1_c037c783_7a5d_4fd2_aac7_dc05898699c8 =====
 .venv/lib/python3.11/site-packages/torch/fx/_lazy_graph_module.py class GraphModule(torch.nn.Module):
    def forward(self, L_x_: "f32[1000][1]cpu"):
        l_x_ = L_x_

        # File: ops/gelu.py:227 in <lambda>, code: reference=lambda x, a=_approximate: F.gelu(x, approximate=a),
        gelu: "f32[1000][1]cpu" = torch._C._nn.gelu(l_x_, approximate = 'none');  l_x_ = None
        return (gelu,)
