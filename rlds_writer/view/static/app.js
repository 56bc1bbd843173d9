// Wiring: the dataset, the split, the list, the player, the keys and the URL.
"use strict";
window.RV = window.RV || {};

(function () {
  let list, player, urlTimer = null;
  // The episode asked for last: quick ↑/↓ presses each move on from it, in order.
  let wanted = null, moves = Promise.resolve();

  let latest = null;
  function writeUrl(split, episode, step) {
    // ?split=&episode=&step=: a link opens the same frame. At most every 250 ms while
    // playing (browsers limit replaceState calls), at once otherwise.
    latest = new URLSearchParams({ split, episode: String(episode), step: String(step) });
    const write = () => { urlTimer = null; history.replaceState(null, "", "?" + latest); };
    if (!(player && player.playing)) { clearTimeout(urlTimer); write(); }
    else if (urlTimer === null) urlTimer = setTimeout(write, 250);
  }

  async function open(id, step) {
    wanted = id;
    try {
      if (await player.open(list.split, id, step)) list.highlight(id);
    } catch (e) {
      document.getElementById("empty").hidden = false;
      document.getElementById("empty").textContent = "cannot open episode " + id + ": " + e.message;
    }
  }

  function neighbour(dir) {
    moves = moves.then(async () => {
      const from = wanted !== null ? wanted : (player.episode ? player.episode.id : null);
      if (from === null) return;
      const id = await list.neighbour(from, dir);
      if (id !== null && id !== undefined) open(id, 0);
    }).catch(() => {});
  }

  function keys(ev) {
    const target = ev.target;
    if (target && (target.tagName === "INPUT" && target.type !== "range" ||
        target.tagName === "SELECT" || target.tagName === "TEXTAREA")) return;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const actions = {
      ArrowLeft: () => player.stepBy(-1),
      ArrowRight: () => player.stepBy(1),
      ArrowUp: () => neighbour(-1),
      ArrowDown: () => neighbour(1),
      " ": () => player.toggle(),
    };
    const action = actions[ev.key];
    if (action) { ev.preventDefault(); action(); }
  }

  function showDataset(info) {
    RV.dataset = info;
    document.getElementById("dataset-name").textContent =
      info.name + " " + info.version + " · " + info.path;
    document.getElementById("live").hidden = !info.being_written;
    const select = document.getElementById("split");
    select.replaceChildren(...Object.entries(info.splits).map(([name, n]) => {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name + " (" + n + ")";
      return option;
    }));
    const leftOut = document.getElementById("left-out");
    leftOut.replaceChildren(...info.fields.left_out.map(({ name, reason }) => {
      const li = document.createElement("li");
      const b = document.createElement("b");
      b.textContent = name;
      li.append(b, ": " + reason);
      return li;
    }));
    if (!info.fields.left_out.length) leftOut.textContent = "(every field is shown)";
  }

  async function start() {
    const response = await fetch("/api/dataset");
    const info = await response.json();
    showDataset(info);
    list = new RV.EpisodeList(open);
    player = new RV.Player(writeUrl);
    RV.player = player;  // for the page tests and benchmarks/viewer.py
    const url = new URLSearchParams(location.search);
    const splits = Object.keys(info.splits);
    list.split = splits.includes(url.get("split")) ? url.get("split") : (splits[0] || "");
    const select = document.getElementById("split");
    select.value = list.split;
    select.addEventListener("change", () => {
      list.split = select.value;
      list.offset = 0;
      list.load();
      const first = 0;
      if (info.splits[list.split]) open(first, 0);
    });
    document.addEventListener("keydown", keys);
    await list.load();
    const episode = Number.parseInt(url.get("episode") || "", 10);
    const step = Number.parseInt(url.get("step") || "0", 10) || 0;
    if (Number.isInteger(episode) && episode >= 0 && episode < (info.splits[list.split] || 0)) {
      await open(episode, step);
    } else if (info.splits[list.split]) {
      await open(0, 0);
    }
    if (info.being_written) {
      // A dataset being written: the list follows its commits.
      setInterval(async () => {
        const again = await fetch("/api/dataset").then((r) => r.json()).catch(() => null);
        if (again && JSON.stringify(again.splits) !== JSON.stringify(RV.dataset.splits)) {
          showDataset(again);
          select.value = list.split;
          list.load();
        }
      }, 3000);
    }
  }

  start().catch((e) => {
    document.getElementById("empty").textContent = "cannot load the dataset: " + e.message;
  });
})();
