// Orbit console: live refresh of the page's panel, and the fairness chart.
// No framework and no build step. The panel is re-fetched every POLL_MS with
// If-None-Match; an unchanged panel answers 304 and nothing is redrawn. Panels are
// rendered (and escaped) by the node; this script never builds markup from data.
"use strict";

(function () {
  const POLL_MS = 2000;
  // Fairness chart: the samples of the last WINDOW_MS; rates over RATE_SPAN_MS.
  const WINDOW_MS = 10 * 60 * 1000;
  const RATE_SPAN_MS = 10 * 1000;
  const COLOURS = ["#2f6fdb", "#d9480f", "#2b8a3e", "#9c36b5", "#e8590c", "#0b7285", "#c2255c", "#5c940d"];
  const SVG = "http://www.w3.org/2000/svg";

  const region = document.getElementById("live");
  const status = document.getElementById("live-status");
  const samples = [];
  let etag = null;
  let polls = 0;

  function clock(date) {
    return date.toTimeString().slice(0, 8);
  }

  function setStatus(text, stale) {
    if (!status) return;
    status.textContent = text;
    status.classList.toggle("stale", stale);
  }

  async function poll() {
    const headers = {};
    if (etag) headers["If-None-Match"] = etag;
    try {
      const response = await fetch(region.dataset.live, {
        headers: headers,
        cache: "no-store",
        credentials: "same-origin",
        redirect: "error",
      });
      if (response.status === 401) {
        window.location.assign(response.headers.get("Orbit-Sign-In") || "/console/sign-in");
        return;
      }
      if (response.status === 200) {
        region.innerHTML = await response.text();
        etag = response.headers.get("ETag");
      }
      if (response.status === 200 || response.status === 304) {
        setStatus("live: refreshed every 2 s, last at " + clock(new Date()), false);
      } else {
        setStatus("not refreshed since " + clock(new Date()) + ": the node answered " + response.status, true);
      }
    } catch (error) {
      setStatus("not refreshed since " + clock(new Date()) + ": the node did not answer", true);
    }
    polls += 1;
    document.body.dataset.polls = String(polls);
    fairness();
    window.setTimeout(poll, POLL_MS);
  }

  // -- fairness chart --------------------------------------------------------------------

  function sample() {
    const rows = document.querySelectorAll("#turns tr.app-turns");
    if (!rows.length) return;
    const point = { at: Date.now(), turns: new Map(), names: new Map() };
    rows.forEach(function (row) {
      point.turns.set(row.dataset.applicationId, Number(row.dataset.turns));
      point.names.set(row.dataset.applicationId, row.dataset.application);
    });
    samples.push(point);
    while (samples.length && samples[0].at < point.at - WINDOW_MS) samples.shift();
  }

  // Turns per second of each application at each sample, over the last RATE_SPAN_MS.
  function rates() {
    const series = new Map();
    let from = 0;
    for (let i = 1; i < samples.length; i += 1) {
      const now = samples[i];
      while (from < i - 1 && samples[from + 1].at <= now.at - RATE_SPAN_MS) from += 1;
      const before = samples[from];
      const seconds = (now.at - before.at) / 1000;
      if (seconds <= 0) continue;
      now.turns.forEach(function (turns, id) {
        const earlier = before.turns.has(id) ? before.turns.get(id) : turns;
        if (!series.has(id)) series.set(id, []);
        series.get(id).push({ at: now.at, rate: Math.max(0, turns - earlier) / seconds });
      });
    }
    return series;
  }

  function element(name, attributes) {
    const node = document.createElementNS(SVG, name);
    Object.keys(attributes).forEach(function (key) {
      node.setAttribute(key, String(attributes[key]));
    });
    return node;
  }

  function draw() {
    const chart = document.getElementById("turn-chart");
    const legend = document.getElementById("turn-legend");
    if (!chart || !legend) return;
    const series = rates();
    const width = 640, height = 220, left = 44, bottom = 22, top = 10, right = 10;
    const last = samples.length ? samples[samples.length - 1] : null;
    const end = last ? last.at : Date.now();
    // The time axis runs from the first sample (the page opening) to now, 10 min at most.
    const start = samples.length ? Math.max(end - WINDOW_MS, samples[0].at) : end - WINDOW_MS;
    const span = Math.max(end - start, 1);
    let peak = 1;
    series.forEach(function (points) {
      points.forEach(function (p) { peak = Math.max(peak, p.rate); });
    });
    chart.replaceChildren();
    const x = function (at) { return left + ((at - start) / span) * (width - left - right); };
    const y = function (rate) { return height - bottom - (rate / peak) * (height - bottom - top); };
    chart.appendChild(element("line", { class: "axis", x1: left, y1: height - bottom, x2: width - right, y2: height - bottom }));
    chart.appendChild(element("line", { class: "axis", x1: left, y1: top, x2: left, y2: height - bottom }));
    [0, peak / 2, peak].forEach(function (value) {
      const label = element("text", { x: left - 6, y: y(value) + 3, "text-anchor": "end" });
      label.textContent = value.toFixed(1);
      chart.appendChild(label);
    });
    const caption = element("text", { x: left, y: height - 6 });
    caption.textContent = "claim turns per second (" + RATE_SPAN_MS / 1000 + " s average) over the last " +
      Math.round(span / 1000) + " s since this page opened (10 min at most)";
    chart.appendChild(caption);
    legend.replaceChildren();
    const first = samples.length ? samples[0] : null;
    let windowTotal = 0;
    const gained = new Map();
    if (first && last) {
      last.turns.forEach(function (turns, id) {
        const delta = Math.max(0, turns - (first.turns.has(id) ? first.turns.get(id) : turns));
        gained.set(id, delta);
        windowTotal += delta;
      });
    }
    // Shares only when every application is shown (a credential with metrics:read).
    const nodeWide = document.getElementById("turns").dataset.nodeWide === "yes";
    const ids = last ? Array.from(last.turns.keys()).sort() : [];
    ids.forEach(function (id, index) {
      const colour = COLOURS[index % COLOURS.length];
      const points = series.get(id) || [];
      if (points.length) {
        chart.appendChild(element("polyline", {
          stroke: colour,
          points: points.map(function (p) { return x(p.at).toFixed(1) + "," + y(p.rate).toFixed(1); }).join(" "),
        }));
      }
      const item = document.createElement("li");
      item.dataset.applicationId = id;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.setAttribute("data-colour", String(index % COLOURS.length));
      item.appendChild(swatch);
      const now = points.length ? points[points.length - 1].rate : 0;
      const share = nodeWide && windowTotal ? (100 * gained.get(id)) / windowTotal : null;
      item.appendChild(document.createTextNode(
        last.names.get(id) + ": " + now.toFixed(1) + " turns/s" +
        (share === null ? "" : ", " + share.toFixed(1) + " % of the turns shown")
      ));
      legend.appendChild(item);
    });
  }

  function fairness() {
    if (!document.getElementById("turns")) return;
    sample();
    draw();
  }

  if (region && region.dataset.live) {
    fairness();
    window.setTimeout(poll, POLL_MS);
  }
})();
