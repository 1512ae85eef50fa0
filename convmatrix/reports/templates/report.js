// convmatrix reports: click a header to sort, type in a filter box to hide rows; both stay in
// the address (#sort.t2=3d&filter.failure-list=crashed, after an anchor such as #case-<id>).
// No libraries.
(function () {
  "use strict";
  var state = {}, anchor = "";
  function readHash() {
    location.hash.slice(1).split("&").forEach(function (part) {
      if (!part) return;
      var eq = part.indexOf("=");
      try {
        if (eq < 0) anchor = decodeURIComponent(part);
        else state[decodeURIComponent(part.slice(0, eq))] = decodeURIComponent(part.slice(eq + 1));
      } catch (e) { /* a hash we did not write */ }
    });
  }
  function writeHash() {
    var parts = anchor ? [encodeURIComponent(anchor)] : [];
    Object.keys(state).sort().forEach(function (key) {
      if (state[key] !== "") parts.push(encodeURIComponent(key) + "=" + encodeURIComponent(state[key]));
    });
    var hash = parts.length ? "#" + parts.join("&") : "";
    try {
      history.replaceState(null, "", location.pathname + location.search + hash);
    } catch (e) { /* some file:// pages refuse; the page still works */ }
  }
  function cellValue(row, index) {
    var cell = row.cells[index];
    if (!cell) return "";
    var raw = cell.getAttribute("data-value");
    if (raw !== null) {
      var num = parseFloat(raw);
      if (raw === "nan" || raw === "inf") return Infinity;
      if (!isNaN(num)) return num;
      return raw;
    }
    return cell.textContent.trim();
  }
  function sortBy(table, index, header, asc) {
    var body = table.tBodies[0];
    if (!body) return;
    Array.prototype.forEach.call(header.parentNode.cells, function (th) {
      th.removeAttribute("data-dir");
    });
    header.setAttribute("data-dir", asc ? "asc" : "desc");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      var cmp = (typeof x === "number" && typeof y === "number")
        ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
      return asc ? cmp : -cmp;
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  readHash();
  document.querySelectorAll("table.sortable").forEach(function (table, n) {
    var head = table.tHead;
    if (!head) return;
    var key = "sort." + (table.id || "t" + n);
    var cells = head.rows[head.rows.length - 1].cells;
    Array.prototype.forEach.call(cells, function (th, index) {
      th.classList.add("sortable");
      th.addEventListener("click", function (event) {
        if (event.target.closest("a")) return;  // a link in a header is followed, not sorted
        var asc = th.getAttribute("data-dir") !== "asc";
        sortBy(table, index, th, asc);
        state[key] = index + (asc ? "" : "d");
        writeHash();
      });
    });
    var wanted = /^(\d+)(d?)$/.exec(state[key] || "");
    if (wanted && cells[+wanted[1]]) sortBy(table, +wanted[1], cells[+wanted[1]], !wanted[2]);
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    var target = document.getElementById(input.getAttribute("data-target"));
    if (!target) return;
    var key = "filter." + input.getAttribute("data-target");
    function apply() {
      var needle = input.value.toLowerCase();
      target.querySelectorAll("[data-filter-row]").forEach(function (row) {
        row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) < 0;
      });
    }
    input.addEventListener("input", function () {
      apply();
      state[key] = input.value;
      writeHash();
    });
    if (state[key]) {
      input.value = state[key];
      apply();
    }
  });
  if (anchor && Object.keys(state).length) {
    // With state after it the browser does not find the anchor by itself.
    var spot = document.getElementById(anchor);
    if (spot) {
      if (spot.tagName === "DETAILS") spot.open = true;
      spot.classList.add("targeted");
      spot.scrollIntoView();
    }
  }
})();
