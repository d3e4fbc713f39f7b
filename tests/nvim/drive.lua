-- Drives Neovim's built-in LSP client against `ralph-flow lsp` as a person would, and writes
-- what Neovim shows to a JSON file that tests/nvim.rs reads and judges. Run by tests/nvim.rs:
--   nvim --headless --clean -i NONE -n -u tests/nvim/init.lua -c "luafile tests/nvim/drive.lua"
-- with RF_NVIM_ROOT (a copy of workflows/, prompts/ and schemas/, with a broken copy of
-- spider.toml at workflows/spider-broken.toml) and RF_NVIM_OUT (the JSON file to write).
-- Every step records what it saw, or the error that stopped it; the file is rewritten after
-- each step, so a run killed for hanging still tells how far it came.

local root = assert(os.getenv("RF_NVIM_ROOT"), "RF_NVIM_ROOT is not set")
local out_path = assert(os.getenv("RF_NVIM_OUT"), "RF_NVIM_OUT is not set")
local api = vim.api

-- Switching between modified buffers, as `set hidden` lets a person do.
vim.o.hidden = true

local out = { nvim = tostring(vim.version().major) .. "." .. vim.version().minor .. "." .. vim.version().patch, notifications = {}, log = {}, steps = {} }

local function save()
  local f = assert(io.open(out_path, "w"))
  f:write(vim.fn.json_encode(out))
  f:close()
end

-- What Neovim would have shown in its message area (hover's "No information available",
-- rename's "nothing to rename", errors of handlers).
vim.notify = function(msg, level)
  table.insert(out.notifications, { message = tostring(msg), level = level or 0 })
end

-- Every publication of diagnostics, by file, so that "no diagnostics" means "the server
-- said none", not "nothing arrived yet".
local published = {}
local default_publish = vim.lsp.handlers["textDocument/publishDiagnostics"]
vim.lsp.handlers["textDocument/publishDiagnostics"] = function(err, result, ctx, config)
  if result and result.uri then
    local path = vim.uri_to_fname(result.uri)
    published[path] = (published[path] or 0) + 1
  end
  return default_publish(err, result, ctx, config)
end
-- The server's log messages (a caught panic is one).
vim.lsp.handlers["window/logMessage"] = function(_, result)
  if result then
    table.insert(out.log, result.message)
  end
end

local function file(rel)
  return root .. "/" .. rel
end

local function wait(ms, cond)
  return vim.wait(ms, cond, 20)
end

-- Waits for `cond`, or until Neovim shows a message (an answer that gives nothing shows
-- one: "No information available", "nothing to rename").
local function wait_or_told(ms, cond)
  local told = #out.notifications
  wait(ms, function()
    return cond() or #out.notifications > told
  end)
  return cond()
end

local function client()
  return vim.lsp.get_active_clients()[1]
end

local function buf_text(buf)
  return table.concat(api.nvim_buf_get_lines(buf, 0, -1, false), "\n")
end

-- The diagnostics of a buffer as Neovim holds them (0-based line, byte column).
local function diagnostics(buf)
  local list = {}
  for _, d in ipairs(vim.diagnostic.get(buf)) do
    table.insert(list, {
      lnum = d.lnum,
      col = d.col,
      end_lnum = d.end_lnum,
      end_col = d.end_col,
      severity = d.severity,
      code = d.code and tostring(d.code) or "",
      message = d.message,
    })
  end
  return list
end

-- Opens a file as `:edit` does (the init.lua's autocommand attaches the server) and waits
-- for the server's first diagnostics of it.
local function edit(rel)
  local path = file(rel)
  local before = published[path] or 0
  vim.cmd("edit " .. vim.fn.fnameescape(path))
  local buf = api.nvim_get_current_buf()
  local arrived = wait(10000, function()
    return (published[path] or 0) > before
  end)
  return buf, arrived
end

-- Puts the cursor on the `delta`-th byte of the first `needle` at or after `from` (1-based line).
local function cursor_at(buf, needle, delta, from)
  local lines = api.nvim_buf_get_lines(buf, 0, -1, false)
  for i = from or 1, #lines do
    local col = lines[i]:find(needle, 1, true)
    if col then
      api.nvim_win_set_cursor(0, { i, col - 1 + (delta or 0) })
      return { line = i - 1, col = col - 1 + (delta or 0) }
    end
  end
  error("`" .. needle .. "` is not in " .. api.nvim_buf_get_name(buf))
end

-- Waits until the server answers a request on `buf`: every answer comes after the server
-- has re-checked the current text and published what changed.
local function sync(buf)
  vim.lsp.buf_request_sync(buf, "textDocument/documentSymbol", { textDocument = vim.lsp.util.make_text_document_params(buf) }, 10000)
  wait(300, function()
    return false
  end)
end

local function step(name, f)
  local record = {}
  out.steps[name] = record
  local ok, err = pcall(f, record)
  if not ok then
    record.error = tostring(err)
  end
  save()
end

local spider, broken

step("start", function(r)
  local arrived
  spider, arrived = edit("workflows/spider.toml")
  r.published = arrived
  local c = client()
  r.client = c and c.name or ""
  r.attached = vim.lsp.buf_is_attached(spider, c and c.id or -1)
  r.initialized = wait(10000, function()
    return client() ~= nil and client().initialized == true
  end)
end)

-- (1) Diagnostics: none in the preset, the typo in the broken copy, gone once fixed by typing.
step("diagnostics", function(r)
  r.preset = diagnostics(spider)
  local arrived
  broken, arrived = edit("workflows/spider-broken.toml")
  r.broken_published = arrived
  wait(5000, function()
    return #vim.diagnostic.get(broken) > 0
  end)
  r.broken = diagnostics(broken)
  -- Fix the typo as a person would, in the buffer (the client sends didChange).
  local at = cursor_at(broken, '"specfy"', 1)
  api.nvim_buf_set_text(broken, at.line, at.col, at.line, at.col + 6, { "specify" })
  r.fixed_cleared = wait(5000, function()
    return #vim.diagnostic.get(broken) == 0
  end)
  r.fixed = diagnostics(broken)
  -- Done with the copy: it reads the same prompt files as the preset, and the rename below
  -- is the preset's alone.
  vim.cmd("bwipeout! " .. broken)
  os.remove(file("workflows/spider-broken.toml"))
  r.preset_after = diagnostics(spider)
end)

-- (2) Completion inside `{{ stages. }}` in a prompt file, typed into the buffer.
step("completion", function(r)
  local review, arrived = edit("prompts/spider/review.md.j2")
  r.published = arrived
  r.diagnostics_before = diagnostics(review)
  local last = api.nvim_buf_line_count(review)
  api.nvim_buf_set_lines(review, last, last, false, { "{{ stages. }}" })
  api.nvim_win_set_cursor(0, { last + 1, #"{{ stages." })
  local params = vim.lsp.util.make_position_params()
  r.position = params.position
  local answers = vim.lsp.buf_request_sync(review, "textDocument/completion", params, 10000) or {}
  r.words = {}
  r.items = {}
  for _, answer in pairs(answers) do
    if answer.err then
      r.request_error = vim.inspect(answer.err)
    end
    -- What the completion menu shows (the conversion `vim.lsp.omnifunc` makes).
    for _, item in ipairs(vim.lsp.util.text_document_completion_list_to_complete_items(answer.result or {}, "")) do
      table.insert(r.words, item.word)
      table.insert(r.items, { word = item.word, abbr = item.abbr, kind = item.kind, menu = item.menu })
    end
  end
  -- Undo the insertion: the prompt file is the shipped one again.
  api.nvim_buf_set_lines(review, last, last + 1, false, {})
  sync(review)
  r.diagnostics_after = diagnostics(review)
  vim.cmd("write")
end)

-- (3) Hover on a stage reference: what the floating window shows.
step("hover", function(r)
  vim.cmd("buffer " .. spider)
  r.cursor = cursor_at(spider, "stages.specify.output.summary", #"stages.")
  local before = {}
  for _, w in ipairs(api.nvim_list_wins()) do
    before[w] = true
  end
  vim.lsp.buf.hover()
  local float
  wait_or_told(10000, function()
    for _, w in ipairs(api.nvim_list_wins()) do
      if not before[w] and api.nvim_win_get_config(w).relative ~= "" then
        float = w
        return true
      end
    end
    return false
  end)
  r.shown = float ~= nil
  r.lines = float and api.nvim_buf_get_lines(api.nvim_win_get_buf(float), 0, -1, false) or {}
  if float then
    api.nvim_win_close(float, true)
  end
end)

-- (4) Go to definition from `prompt_file = "specify.md.j2"`: where the cursor lands.
step("definition", function(r)
  vim.cmd("buffer " .. spider)
  r.from = cursor_at(spider, 'prompt_file = "specify.md.j2"', #'prompt_file = "s')
  vim.lsp.buf.definition()
  r.jumped = wait(5000, function()
    return api.nvim_get_current_buf() ~= spider
  end)
  r.file = api.nvim_buf_get_name(0)
  local pos = api.nvim_win_get_cursor(0)
  r.line = pos[1] - 1
  r.col = pos[2]
  r.attached = vim.lsp.buf_is_attached(0, client().id)
  vim.cmd("buffer " .. spider)
end)

-- (6) The outline: the raw nested answer, and the list `:lua vim.lsp.buf.document_symbol()`
-- fills.
step("symbols", function(r)
  vim.cmd("buffer " .. spider)
  local function tree(symbols)
    local list = {}
    for _, s in ipairs(symbols or {}) do
      table.insert(list, {
        name = s.name,
        kind = s.kind,
        detail = s.detail or "",
        line = (s.range or (s.location and s.location.range) or { start = { line = -1 } }).start.line,
        children = tree(s.children),
      })
    end
    return list
  end
  local answers = vim.lsp.buf_request_sync(spider, "textDocument/documentSymbol", { textDocument = vim.lsp.util.make_text_document_params(spider) }, 10000) or {}
  r.tree = {}
  for _, answer in pairs(answers) do
    if answer.err then
      r.request_error = vim.inspect(answer.err)
    end
    r.tree = tree(answer.result)
  end
  -- Neovim lists them in the quickfix list (the location list with `{ loclist = true }`)
  -- and opens its window.
  local win = api.nvim_get_current_win()
  vim.lsp.buf.document_symbol()
  local function listed()
    local items = vim.fn.getqflist()
    if #items == 0 then
      items = vim.fn.getloclist(win)
    end
    return items
  end
  wait_or_told(10000, function()
    return #listed() > 0
  end)
  r.list = {}
  for _, item in ipairs(listed()) do
    table.insert(r.list, item.text)
  end
  vim.cmd("cclose")
  vim.cmd("lclose")
  api.nvim_set_current_win(win)
  vim.cmd("buffer " .. spider)
end)

-- (7) References of a stage: the list `:lua vim.lsp.buf.references()` fills, over the
-- workflow and the prompt files that read it.
step("references", function(r)
  vim.cmd("buffer " .. spider)
  r.cursor = cursor_at(spider, "[stages.phases.stages.phase_loop.stages.implement]", #"[stages.phases.stages.phase_loop.stages.")
  vim.fn.setqflist({})
  local win = api.nvim_get_current_win()
  vim.lsp.buf.references()
  wait_or_told(10000, function()
    return #vim.fn.getqflist() > 0
  end)
  r.list = {}
  for _, item in ipairs(vim.fn.getqflist()) do
    table.insert(r.list, {
      file = api.nvim_buf_get_name(item.bufnr),
      line = item.lnum - 1,
      col = item.col - 1,
      text = item.text,
    })
  end
  vim.cmd("cclose")
  api.nvim_set_current_win(win)
  vim.cmd("buffer " .. spider)
end)

-- (8) A code action: a need typed wrong, the quick fix the server offers for it, applied by
-- Neovim; the diagnostic goes and the text is the preset's again.
step("code_action", function(r)
  vim.cmd("buffer " .. spider)
  local before = buf_text(spider)
  local at = cursor_at(spider, 'needs = ["plan"]', #'needs = ["')
  api.nvim_buf_set_text(spider, at.line, at.col, at.line, at.col + 4, { "plna" })
  r.diagnosed = wait(5000, function()
    return #vim.diagnostic.get(spider) > 0
  end)
  r.diagnostics = diagnostics(spider)
  local params = vim.lsp.util.make_range_params()
  params.context = { diagnostics = vim.lsp.diagnostic.get_line_diagnostics(spider) }
  local answers = vim.lsp.buf_request_sync(spider, "textDocument/codeAction", params, 10000) or {}
  r.titles = {}
  local chosen
  for _, answer in pairs(answers) do
    if answer.err then
      r.request_error = vim.inspect(answer.err)
    end
    for _, action in ipairs(answer.result or {}) do
      table.insert(r.titles, action.title)
      if action.isPreferred and not chosen then
        chosen = action
      end
    end
  end
  if chosen and chosen.edit then
    vim.lsp.util.apply_workspace_edit(chosen.edit, client().offset_encoding)
  end
  r.cleared = wait(5000, function()
    return #vim.diagnostic.get(spider) == 0
  end)
  r.restored = buf_text(spider) == before
end)

-- (5) Rename a stage where it is defined; Neovim applies the workspace edit itself (the
-- rename handler), to the workflow and to the prompt files that read the stage.
step("rename", function(r)
  vim.cmd("buffer " .. spider)
  r.cursor = cursor_at(spider, "[stages.phases.stages.phase_loop.stages.implement]", #"[stages.phases.stages.phase_loop.stages.")
  local prompts = { "prompts/spider/defend.md.j2", "prompts/spider/evaluate.md.j2" }
  local before = buf_text(spider)
  vim.lsp.buf.rename("build")
  r.applied = wait_or_told(10000, function()
    return buf_text(spider) ~= before
  end)
  r.workflow = buf_text(spider)
  r.prompts = {}
  r.attached = {}
  for _, rel in ipairs(prompts) do
    local b = vim.fn.bufnr(file(rel))
    r.prompts[rel] = b > 0 and api.nvim_buf_is_loaded(b) and buf_text(b) or ""
    r.attached[rel] = b > 0 and vim.lsp.buf_is_attached(b, client().id)
  end
  -- What the server says of the renamed text, unsaved, then saved (`:wall`).
  sync(spider)
  local function all_diagnostics()
    local seen = {}
    for _, b in ipairs(api.nvim_list_bufs()) do
      if api.nvim_buf_is_loaded(b) then
        for _, d in ipairs(diagnostics(b)) do
          d.file = api.nvim_buf_get_name(b)
          table.insert(seen, d)
        end
      end
    end
    return seen
  end
  r.diagnostics_unsaved = all_diagnostics()
  vim.cmd("silent wall")
  sync(spider)
  r.diagnostics_saved = all_diagnostics()
  r.on_disk = table.concat(vim.fn.readfile(file("prompts/spider/defend.md.j2")), "\n")
end)

save()
vim.cmd("qa!")
