-- ralph-flow's language server for workflow files and their prompt templates, in Neovim's
-- built-in client (0.7 and later). tests/nvim.rs runs Neovim with this file as its init.lua,
-- and README.md shows it: keep the two the same.
local ralph_flow_clients = {} -- Neovim 0.7: one server per project
vim.api.nvim_create_autocmd({ "BufReadPost", "BufNewFile" }, {
  pattern = { "*/workflows/*.toml", "*/workflows/*.kdl", "*.j2" },
  callback = function(args)
    local file = vim.api.nvim_buf_get_name(args.buf)
    -- The project: the directory that holds workflows/ (else the file's own directory).
    local dir = vim.fn.fnamemodify(file, ":p:h")
    local workflows = vim.fn.finddir("workflows", dir .. ";")
    local root = workflows ~= "" and vim.fn.fnamemodify(workflows, ":p:h:h") or dir
    local config = { name = "ralph-flow", cmd = { "ralph-flow", "lsp" }, root_dir = root }
    if vim.lsp.start then -- Neovim 0.8 and later
      vim.lsp.start(config, { bufnr = args.buf })
    else -- Neovim 0.7
      ralph_flow_clients[root] = ralph_flow_clients[root] or vim.lsp.start_client(config)
      vim.lsp.buf_attach_client(args.buf, ralph_flow_clients[root])
    end
  end,
})
