// convmatrix reports: click a header to sort, type in a filter box to hide rows. No libraries.
(function () {
  "use strict";
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
  function sortBy(table, index, header) {
    var body = table.tBodies[0];
    if (!body) return;
    var asc = header.getAttribute("data-dir") !== "asc";
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
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var head = table.tHead;
    if (!head) return;
    Array.prototype.forEach.call(head.rows[head.rows.length - 1].cells, function (th, index) {
      th.classList.add("sortable");
      th.addEventListener("click", function () { sortBy(table, index, th); });
    });
  });
  document.querySelectorAll("input.filter").forEach(function (input) {
    var target = document.getElementById(input.getAttribute("data-target"));
    if (!target) return;
    input.addEventListener("input", function () {
      var needle = input.value.toLowerCase();
      target.querySelectorAll("[data-filter-row]").forEach(function (row) {
        row.hidden = needle !== "" && row.textContent.toLowerCase().indexOf(needle) < 0;
      });
    });
  });
})();
