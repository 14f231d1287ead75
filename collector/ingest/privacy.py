"""The form privacy floor (spec 2.3, form): what is never captured, whatever the configuration.

A form field is classified from three kinds of evidence:

- its name (the key in `values`, a name in `raw_fields`, a file entry's
  `field`), split into lower-case words (`cardNumber`, `card-number`,
  `card_number` and `CARDNumber` all give `card number`; accents are folded,
  and the lists hold the common names in other European languages). Names are also
  written run together (`accountnumber`, `userpassword`), so a word or the
  whole name that contains a long enough sensitive word or word pair
  (`passwd`, `income`: six letters or more; pairs such as `cardcvv`: seven)
  counts too; shorter ones (`ssn`, `cvv`, `taxid`, `cardno`) must match a
  whole word;
- its declared type in `raw_fields` (HTML autocomplete tokens such as
  `cc-number`, `cc-csc`, or input types such as `password`; any token of a
  multi-token value such as `section-pay cc-csc` or `current-password webauthn`);
- its value (a US social security or taxpayer number, an IBAN that passes its mod-97
  check).

Classes: `payment` (card number, CVV, expiry, card holder), `government_id`
(SSN, passport, driver's licence, national or tax id), `financial` (bank
account, IBAN, routing or sort code, income), `health` (diagnosis,
medication, allergies, insurance member id, ...) and `secret` (passwords and
one-time codes: no production collector stores those either).

A field of any class loses its value (and its file metadata); the event keeps
the remaining fields, and the stored event names the withheld fields and
their classes in the server field `privacyWithheld`. A form
recognised as a checkout is dropped whole: it has a payment field, or its
`formId` / `form_selector` names a checkout or payment form.

Card numbers themselves never get this far: the payment scan refuses the
whole request first (spec 4.1 rule 5). Pure functions, no I/O.
"""

from __future__ import annotations

import functools
import re
import unicodedata

import msgspec

from collector.ingest.schema import FileMeta, Form
from collector.ingest.validate import RAW_FIELDS_DECODER

_WORDS = re.compile(r"[a-z]+|[0-9]+")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
_ACRONYM = re.compile(r"([A-Z])([A-Z][a-z])")  # "CVVCode" -> "CVV Code"

# Single words that decide a class on their own.
_WORD_CLASS: dict[str, str] = {
    # payment
    "cvv": "payment", "cvv2": "payment", "cvc": "payment", "cvc2": "payment", "csc": "payment",
    "ccv": "payment", "cardholder": "payment", "creditcard": "payment", "cardnumber": "payment",
    "ccnumber": "payment", "ccnum": "payment", "ccexp": "payment",
    # government id
    "ssn": "government_id", "passport": "government_id", "itin": "government_id", "tin": "government_id",
    "nino": "government_id", "aadhaar": "government_id", "nric": "government_id",
    "cpf": "government_id", "curp": "government_id", "bsn": "government_id",
    "dni": "government_id", "personnummer": "government_id", "ssnlast4": "government_id",
    # financial
    "iban": "financial", "bic": "financial", "swiftcode": "financial", "routing": "financial",
    "aba": "financial", "income": "financial", "salary": "financial", "bankaccount": "financial",
    # health
    "diagnosis": "health", "diagnoses": "health", "medication": "health",
    "medications": "health", "prescription": "health", "prescriptions": "health",
    "allergy": "health", "allergies": "health", "symptom": "health", "symptoms": "health",
    "medical": "health", "health": "health", "patient": "health", "pregnancy": "health",
    "disability": "health", "treatment": "health", "mrn": "health", "icd": "health",
    "hiv": "health", "vaccination": "health", "immunization": "health",
    "disabilities": "health", "pregnant": "health", "medicine": "health", "medicines": "health",
    "illness": "health", "injury": "health", "injuries": "health", "surgery": "health",
    "therapy": "health", "vaccine": "health", "vaccinated": "health", "diagnosed": "health",
    "allergic": "health", "medicare": "health", "medicaid": "health",
    "sin": "government_id", "ein": "government_id", "governmentid": "government_id",
    "bsb": "financial", "ifsc": "financial",
    "ccno": "payment", "ccexpmonth": "payment", "ccexpyear": "payment",
    "pin": "secret", "passphrase": "secret", "totp": "secret", "otpcode": "secret",
    # secrets
    "password": "secret", "passwd": "secret", "pwd": "secret", "passcode": "secret",
    "otp": "secret",
}  # fmt: skip

# The same classes in the languages forms are most often written in besides English
# (Spanish, Portuguese, French, Italian, German, Dutch, the Nordic and Slavic
# languages, Turkish), accents folded: "contraseña" is read as "contrasena". Short
# or ambiguous words need a second word, below: "clave" alone is also a keyword,
# "carte" a map; words that also name data processing ("tratamiento de datos" in a
# consent checkbox) or tooling ("diagnostic") are left out.
_WORD_CLASS.update({
    # secrets
    "contrasena": "secret", "contrasenya": "secret", "senha": "secret", "motdepasse": "secret",
    "passwort": "secret", "kennwort": "secret", "wachtwoord": "secret",
    "haslo": "secret", "heslo": "secret", "sifre": "secret", "salasana": "secret",
    "losenord": "secret", "passord": "secret", "adgangskode": "secret",
    # payment
    "kreditkarte": "payment", "kartennummer": "payment", "kaartnummer": "payment",
    "cryptogramme": "payment", "prufnummer": "payment", "sicherheitscode": "payment",
    "beveiligingscode": "payment", "karteninhaber": "payment", "kaarthouder": "payment",
    "kortnummer": "payment", "korttinumero": "payment", "kortinnehavare": "payment", "kortholder": "payment",
    "kortinhaltija": "payment",
    "sakerhetskod": "payment", "sikkerhetskode": "payment", "sikkerhedskode": "payment", "turvakoodi": "payment",
    # government id
    "pasaporte": "government_id", "passeport": "government_id", "passaporte": "government_id",
    "passaporto": "government_id", "reisepass": "government_id", "paspoort": "government_id",
    "nif": "government_id", "nie": "government_id", "cuit": "government_id", "cuil": "government_id",
    "rfc": "government_id", "cedula": "government_id", "pesel": "government_id",
    "steuernummer": "government_id", "steuerid": "government_id", "personalausweis": "government_id",
    "ausweisnummer": "government_id", "codicefiscale": "government_id",
    "sozialversicherungsnummer": "government_id", "burgerservicenummer": "government_id",
    "henkilotunnus": "government_id",
    # financial
    "kontonummer": "financial", "rekeningnummer": "financial", "bankleitzahl": "financial",
    "clabe": "financial", "salario": "financial", "sueldo": "financial", "ingresos": "financial",
    "einkommen": "financial", "gehalt": "financial", "stipendio": "financial",
    "salaire": "financial", "salaris": "financial",
    "rib": "financial",  # (French: relevé d'identité bancaire, a bank account's details)
    # health
    "diagnostico": "health", "diagnose": "health", "diagnosi": "health",
    "medicamento": "health", "medicamentos": "health", "medicament": "health", "medicaments": "health",
    "farmaci": "health", "alergia": "health", "alergias": "health", "allergie": "health",
    "allergien": "health", "allergia": "health", "enfermedad": "health", "enfermedades": "health",
    "maladie": "health", "krankheit": "health", "malattia": "health", "sintomas": "health",
    "symptome": "health", "sintomi": "health", "embarazo": "health", "embarazada": "health",
    "schwanger": "health", "schwangerschaft": "health", "gravidanza": "health", "grossesse": "health",
    "ordonnance": "health", "paciente": "health",
    "krankenversicherung": "health", "krankenkasse": "health", "versichertennummer": "health",
    "mutuelle": "health",
    "mdp": "secret",  # (French: mot de passe)
    # helper-128's intake, onboarding and banking forms: each of these was stored
    # ("revenu" is inside the English "revenue" of every lead form, "handicap" is golf's, "covid"
    # names policies, "test result" quizzes: helper-130; only the pair "revenu annuel" is kept)
    "cvn": "payment", "tfn": "government_id", "nss": "government_id", "nir": "government_id",
    "blz": "financial",
    "surgeries": "health", "dosage": "health", "medikament": "health",
    "medikamente": "health", "vorerkrankung": "health", "vorerkrankungen": "health", "behinderung": "health",
    "discapacidad": "health", "blutgruppe": "health", "diagnosen": "health",
})  # fmt: skip

# Pairs of words (in order, adjacent) that decide a class together.
_PAIR_CLASS: dict[tuple[str, str], str] = {
    ("card", "number"): "payment", ("card", "num"): "payment", ("card", "no"): "payment",
    ("card", "expiry"): "payment", ("card", "exp"): "payment", ("card", "expiration"): "payment",
    ("card", "code"): "payment", ("card", "cvv"): "payment", ("card", "cvc"): "payment",
    ("cvv", "code"): "payment", ("cvc", "code"): "payment", ("ss", "number"): "government_id",
    ("card", "holder"): "payment", ("cc", "number"): "payment", ("cc", "exp"): "payment",
    ("cc", "name"): "payment", ("cc", "csc"): "payment", ("cc", "cvv"): "payment",
    ("security", "code"): "payment", ("credit", "card"): "payment", ("debit", "card"): "payment",
    ("name", "on"): "payment",  # "name on card"
    ("nameon", "card"): "payment",  # run together: "nameoncard"
    ("social", "security"): "government_id", ("national", "id"): "government_id",
    ("national", "insurance"): "government_id", ("tax", "id"): "government_id",
    ("taxpayer", "id"): "government_id", ("tax", "number"): "government_id",
    ("drivers", "license"): "government_id", ("driver", "license"): "government_id",
    ("driving", "licence"): "government_id", ("driver", "licence"): "government_id",
    ("license", "number"): "government_id", ("licence", "number"): "government_id",
    ("id", "number"): "government_id", ("sin", "number"): "government_id",
    ("account", "number"): "financial", ("account", "no"): "financial",
    ("account", "num"): "financial", ("bank", "account"): "financial",
    ("bank", "name"): "financial", ("sort", "code"): "financial",
    ("routing", "number"): "financial", ("annual", "income"): "financial",
    ("swift", "code"): "financial", ("swift", "bic"): "financial",
    ("insurance", "id"): "health", ("insurance", "member"): "health",
    ("policy", "number"): "health",
    ("blood", "type"): "health", ("medical", "history"): "health",
    ("time", "code"): "secret", ("time", "password"): "secret", ("time", "pin"): "secret",
    ("pin", "number"): "secret", ("card", "pin"): "payment",
    ("security", "answer"): "secret", ("verification", "code"): "secret", ("auth", "code"): "secret",
    ("sms", "code"): "secret", ("mfa", "code"): "secret", ("two", "factor"): "secret",
    ("government", "id"): "government_id", ("social", "insurance"): "government_id",
    ("identification", "number"): "government_id", ("national", "identity"): "government_id",
    ("id", "no"): "government_id", ("license", "no"): "government_id", ("dl", "number"): "government_id",
    ("visa", "number"): "government_id", ("alien", "number"): "government_id",
    ("nhs", "number"): "health", ("insurance", "number"): "health", ("blood", "group"): "health",
    ("acct", "number"): "financial", ("acct", "no"): "financial", ("acc", "no"): "financial",
    ("transit", "number"): "financial",
    ("cc", "no"): "payment", ("exp", "month"): "payment", ("exp", "year"): "payment",
    ("expiry", "month"): "payment", ("expiry", "year"): "payment",
    # other languages (connecting words such as "de" are skipped: "mot de passe")
    ("mot", "passe"): "secret", ("clave", "acceso"): "secret", ("codigo", "verificacion"): "secret",
    ("code", "verification"): "secret", ("codigo", "acesso"): "secret",
    ("numero", "tarjeta"): "payment", ("tarjeta", "credito"): "payment", ("tarjeta", "debito"): "payment",
    ("codigo", "seguridad"): "payment", ("numero", "carte"): "payment", ("carte", "bancaire"): "payment",
    ("carte", "credit"): "payment", ("code", "securite"): "payment", ("numero", "cartao"): "payment",
    ("cartao", "credito"): "payment", ("codigo", "seguranca"): "payment", ("numero", "carta"): "payment",
    ("carta", "credito"): "payment", ("codice", "sicurezza"): "payment",
    ("titular", "tarjeta"): "payment", ("titulaire", "carte"): "payment", ("titular", "cartao"): "payment",
    ("titolare", "carta"): "payment", ("caducidad", "tarjeta"): "payment",
    ("vencimiento", "tarjeta"): "payment", ("expiration", "carte"): "payment",
    ("validade", "cartao"): "payment", ("scadenza", "carta"): "payment",
    ("numer", "karty"): "payment", ("waznosci", "karty"): "payment", ("kortin", "numero"): "payment",
    ("kod", "bezpieczenstwa"): "payment", ("kod", "cvv"): "payment", ("posiadacz", "karty"): "payment",
    ("seguridad", "social"): "government_id", ("seguro", "social"): "government_id",
    ("securite", "sociale"): "government_id", ("numero", "fiscal"): "government_id",
    ("codice", "fiscale"): "government_id", ("carte", "identite"): "government_id",
    ("carta", "identita"): "government_id", ("tarjeta", "identidad"): "government_id",
    ("documento", "identidad"): "government_id", ("numero", "identificacion"): "government_id",
    ("numero", "pasaporte"): "government_id",
    ("numero", "cuenta"): "financial", ("cuenta", "bancaria"): "financial", ("compte", "bancaire"): "financial",
    ("numero", "compte"): "financial", ("conta", "bancaria"): "financial", ("numero", "conta"): "financial",
    ("conto", "corrente"): "financial",
    ("historial", "medico"): "health", ("dossier", "medical"): "health",
    # helper-128: each of these was stored
    # (not "verification value": an email's; "pan number" is India's tax id, not a card's: helper-130)
    ("card", "verification"): "payment", ("pan", "number"): "government_id",
    ("drivers", "licence"): "government_id", ("ni", "number"): "government_id",
    ("tax", "file"): "government_id", ("numero", "secu"): "government_id",
    ("deposit", "account"): "financial", ("code", "banque"): "financial", ("revenu", "annuel"): "financial",
    ("family", "history"): "health", ("antecedents", "medicaux"): "health", ("groupe", "sanguin"): "health",
    ("tipo", "sangre"): "health",
}  # fmt: skip
# Words that join the words of a name in other languages ("numero_de_tarjeta",
# "code-de-securite"): left out when pairs are looked for.
_CONNECTORS = frozenset({"de", "du", "des", "del", "della", "di", "da", "do", "dos", "das", "der", "die",
                         "la", "le", "el", "van", "von", "d"})  # "d": an elided d' ("carte_d_identite")
# Letters that Unicode does not decompose into a base letter and a mark, and "ñ",
# which is read as its sound: "niño" folded to "nino" would be the UK's NINO
# (contraseña reads as the Catalan "contrasenya", which is listed).
_UNDECOMPOSED = str.maketrans({"ñ": "ny", "Ñ": "NY", "ł": "l", "Ł": "L", "ø": "o", "Ø": "O", "æ": "ae", "Æ": "AE", "œ": "oe",
                                "Œ": "OE", "ß": "ss", "đ": "d", "Đ": "D", "ı": "i"})

# Every sensitive word, and every pair written run together ("accountnumber").
_RUN_TOGETHER: dict[str, str] = {**{a + b: kind for (a, b), kind in _PAIR_CLASS.items()}, **_WORD_CLASS}
# Those long enough to be looked for inside a longer word without matching
# ordinary ones ("tin" is in "setting", "hiv" in "archive", "cardno" in
# "cardnotes"): single words of six letters or more, pairs of seven or more.
# Missing a sensitive field stores it; a false match only withholds a value,
# so the few ordinary words that still match are listed instead of raising
# the bar ("patient" in "impatient": at eight letters "patientid" and
# "monthlyincome" would be stored).
_MIN_INSIDE_WORD, _MIN_INSIDE_PAIR = 6, 7
_INSIDE = re.compile("|".join(sorted(
    [re.escape(w) for w in _WORD_CLASS if len(w) >= _MIN_INSIDE_WORD]
    + [re.escape(a + b) for a, b in _PAIR_CLASS if len(a + b) >= _MIN_INSIDE_PAIR],
    key=len, reverse=True)))
_ORDINARY = frozenset({
    "impatient", "impatience", "impatiently", "patiently", "healthcare", "healthy", "healthier",
    "unhealthy", "healthcheck", "healthandsafety", "biomedical", "nonmedical", "phonetime", "bestphonetime",
})

# raw_fields types: HTML autocomplete tokens and input types.
_TYPE_CLASS: dict[str, str] = {"password": "secret", "new-password": "secret",
                               "current-password": "secret", "one-time-code": "secret"}
# (English only: "pago" is also "paid", "Kasse" a savings bank's "Sparkasse", and the words
# after one that name another purpose are English ones; a non-English checkout is still
# found by its payment fields: helper-130)
_CHECKOUT_WORDS = frozenset({"checkout", "payment", "payments", "purchase", "creditcard"})
_FORM_WORDS = frozenset({"", "form", "page", "step", "details", "info", "section", "modal", "method", "methods",
                         "options", "container", "wrapper", "panel"})
# Words that make a "card number", "security code" or "name on" field another kind
# than a payment card's: such a field is withheld, but does not make its form a
# checkout (a loyalty sign-up or a patient intake form is not dropped whole).
_NOT_PAYMENT_CARD = frozenset({
    "loyalty", "library", "member", "membership", "sim", "id", "identity", "green", "insurance",
    "health", "student", "reward", "rewards", "club", "business", "access", "badge", "employee",
    "voter", "driver", "drivers", "medicare", "medicaid", "transit", "metro", "discount", "bonus", "points",
    "certificate", "national", "residence", "resident", "social", "benefit", "benefits",
    "transport", "parking", "fidelity", "patient", "staff", "visitor", "key", "door",
})  # fmt: skip
# Words that make a name a payment card's whatever else it says ("customer[credit_card][number]").
_PAYMENT_CARD_WORDS = frozenset({"credit", "debit", "cc", "cvv", "cvc", "csc", "cardholder", "creditcard",
                                 "credito", "debito", "bancaire", "kreditkarte"})
# The same for card names in languages that put the kind after the card ("tarjeta_fidelidad").
_NOT_PAYMENT_CARD_AFTER = frozenset({
    "fidelidad", "fidelite", "fedelta", "socio", "membre", "miembro", "adherent", "sanitaria", "vitale",
    "transporte", "estudiante", "etudiant", "etudiante", "studente", "cliente", "client", "biblioteca",
    "bibliotheque", "identite", "identita", "identidad", "identidade", "cadeau", "regalo", "presente",
    "grise", "sejour", "residencia", "residenza", "navigo", "jeune", "senior", "famille",
    "fidelidade", "cidadao", "estudante", "saude",
    # Polish: karta lojalnościowa, podarunkowa, miejska, pacjenta, klienta, studencka, biblioteczna
    "lojalnosciowej", "podarunkowej", "miejskiej", "pacjenta", "klienta", "studenckiej", "bibliotecznej",
    "lojalnosciowa", "podarunkowa", "miejska", "studencka", "biblioteczna", "czlonkowskiej",
})  # fmt: skip
# Card words of languages that run the kind into the word ("Kundenkartennummer",
# "klantenkaartnummer"): another kind of card when what comes before names one of
# these (a payment card's otherwise: "ihre_kartennummer", "Visa_Kartennummer").
_COMPOUND_CARD_WORDS = ("kartennummer", "kaartnummer", "karteninhaber", "kaarthouder", "karte", "kaart",
                        "kortnummer", "korttinumero", "kortti", "kort")
_COMPOUND_OTHER_KINDS = frozenset({
    "kunden", "kunde", "mitglieds", "mitglied", "bonus", "treue", "bahn", "bibliotheks", "studenten",
    "schueler", "schuler", "gesundheits", "versicherten", "personal", "dienst", "jahres", "museums",
    "klanten", "klant", "leden", "lid", "ov", "bibliotheek", "spaar", "zorg", "museum",
    "payback", "krankenkassen", "krankenkasse", "chip", "ovchip", "geschenk", "gutschein", "cadeau",
    "monats", "wochen", "zeit", "netz", "mensa", "park", "parkeer",
    # Nordic: medlemskort, presentkort, gavekort, bibliotekskort, rejsekort, lahjakortti...
    "medlems", "medlem", "present", "gave", "biblioteks", "bibliotek", "rejse", "reise", "rese", "buss",
    "lahja", "jasen", "kanta", "kirjasto", "kund", "student", "studie", "sygesikrings",
})  # fmt: skip
# Card words of any of these languages ("codigo_seguridad_tarjeta" is a card's code).
_CARD_WORDS = frozenset({"card", "tarjeta", "carte", "cartao", "carta", "karte", "kaart", "kreditkarte",
                         "kort", "kortin", "kortti", "karta", "karty"})
# A "security code" in these languages is as often a captcha's as a card's: withheld, but
# on its own no checkout ("código de seguridad" under a contact form).
_SECURITY_CODE_PAIRS = frozenset({("codigo", "seguridad"), ("code", "securite"), ("codigo", "seguranca"),
                                  ("codice", "sicurezza"), ("kod", "bezpieczenstwa")})
_SECURITY_CODE_WORDS = frozenset({"sakerhetskod", "sikkerhetskode", "sikkerhedskode", "turvakoodi"})
# Purposes a form named after a checkout may have besides taking the order: "checkoutSurvey",
# "post-checkout-signup" are other forms; "checkout-billing" and "checkout-v2" are checkouts.
_OTHER_PURPOSE = frozenset({
    "survey", "feedback", "signup", "subscribe", "subscription", "newsletter", "review", "reviews",
    "rating", "contact", "support", "help", "login", "register", "registration", "question",
    "questions", "nps", "poll", "comment", "comments", "search", "share", "referral", "unsubscribe",
})  # fmt: skip
# A selector's compound selectors, between combinators (" ", ">", "+", "~").
_COMBINATORS = re.compile(r"\s*[>+~]\s*|\s+")
# A US SSN or ITIN (ITINs are the 9xx area): ddd-dd-dddd with no all-zero group.
_SSN = re.compile(r"^(?!000|666)\d{3}-(?!00)\d{2}-(?!0000)\d{4}$")
_IBAN = re.compile(r"^[A-Z]{2}\d{2}[A-Z0-9]{11,30}$")


def _ascii_letters(name: str) -> str:
    """`name` with its accents folded ("Contraseña" -> "Contrasena"), for names not in ASCII."""
    decomposed = unicodedata.normalize("NFKD", name.translate(_UNDECOMPOSED))
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def _words(name: str) -> list[str]:
    if not name.isascii():
        name = _ascii_letters(name)
    lowered = name.lower()
    if lowered == name:  # nothing to split at case changes (most names; the splits cost 2 us)
        return _WORDS.findall(name)
    return _WORDS.findall(_CAMEL.sub(r"\1 \2", _ACRONYM.sub(r"\1 \2", name)).lower())


@functools.lru_cache(maxsize=8192)
def classify_field_name(name: str) -> str | None:
    """The privacy class a field name belongs to, or None for an ordinary field."""
    words = _words(name)
    compact = "".join(words)
    for word in (*words, compact):
        found = _WORD_CLASS.get(word)
        if found:
            return found
    joined = [word for word in words if word not in _CONNECTORS]
    for pair in zip(joined, joined[1:], strict=False):
        found = _PAIR_CLASS.get(pair)
        if found:
            return found
    for word in (*words, compact):
        found = _RUN_TOGETHER.get(word)
        if found:
            return found
    for word in words:  # not across words: "paidNumber" holds "idnumber"
        if word in _ORDINARY:
            continue
        inside = _INSIDE.search(word)
        if inside:
            return _RUN_TOGETHER[inside.group()]
    return None


def classify_field_type(declared: str) -> str | None:
    """The class of a raw_fields type; a multi-token autocomplete value counts by its tokens."""
    for token in declared.lower().split():
        if token.startswith("cc-"):
            return "payment"
        found = _TYPE_CLASS.get(token)
        if found:
            return found
    return None


def _iban_valid(text: str) -> bool:
    compact = text.replace(" ", "").upper()
    if not _IBAN.match(compact):
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def classify_value(value: str) -> str | None:
    text = value.strip()
    if _SSN.match(text):
        return "government_id"
    if 15 <= len(text) <= 42 and _iban_valid(text):
        return "financial"
    return None


class FloorDecision(msgspec.Struct, frozen=True):
    drop_reason: str | None  # "checkout_form": the whole event is dropped
    form: Form  # the form with sensitive values removed (unchanged when nothing was)
    withheld: dict[str, str] | None = None  # field name -> privacy class
    too_large: int | None = None  # at least this many bytes stored: over the size limit


def _declared_types(raw_fields: str | None) -> dict[str, str]:
    if not raw_fields:
        return {}
    try:
        return RAW_FIELDS_DECODER.decode(raw_fields)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return {}  # validation already rejected a malformed raw_fields


@functools.lru_cache(maxsize=4096)
def names_checkout(text: str) -> bool:
    """True when a form id names a checkout or payment form."""
    # Cached: a site sends the same few form ids and selectors over and over.
    words = _words(text)
    # A checkout word not followed by another purpose ("payment-form", "checkout-billing");
    # "checkoutSurvey" and "post-checkout-signup" are other forms.
    if any(
        word in _CHECKOUT_WORDS and not _OTHER_PURPOSE.intersection(words[i + 1 :])
        for i, word in enumerate(words)
    ):
        return True
    # Run together with a form word ("PAYMENTFORM", "checkoutstep"), or the whole name
    # run together ("creditCard"), not any longer word: "repayment", "checkoutsurvey"
    # and "purchases" are other forms.
    candidates = [(word, False) for word in words] + [("".join(words), True)]
    return any(
        word.startswith(checkout) and (rest := word[len(checkout) :]) in _FORM_WORDS and (rest or whole)
        for word, whole in candidates
        for checkout in _CHECKOUT_WORDS
    )


def selector_names_checkout(selector: str) -> bool:
    """True when a CSS selector's form is a checkout: the nearest compound selector, from
    the form's own outward, that names a checkout or another purpose decides
    ("#checkout-page form.needs-validation" is a checkout, "div.checkout-page >
    form#newsletter" a newsletter form)."""
    for compound in reversed([part for part in _COMBINATORS.split(selector.strip()) if part]):
        if names_checkout(compound):
            return True
        if _OTHER_PURPOSE.intersection(_words(compound)):
            return False
    return False


def is_checkout(form: Form, declared: dict[str, str], name_classes: dict[str, str | None] | None = None) -> bool:
    if names_checkout(form.formId) or (form.form_selector and selector_names_checkout(form.form_selector)):
        return True
    if name_classes is None:
        name_classes = _name_classes(form, declared)
    if any(kind == "payment" and _names_payment_card(name) for name, kind in name_classes.items()):
        return True
    return any(classify_field_type(kind) == "payment" for kind in declared.values())


def _names_payment_card(name: str) -> bool:
    """A payment-class field name that is a payment card's, not a loyalty card's
    number, a captcha's security code or the name on a badge."""
    words = _words(name)
    if _PAYMENT_CARD_WORDS.intersection(words):
        return True
    if "card" in words and words.index("card") > 0 and words[words.index("card") - 1] in _NOT_PAYMENT_CARD:
        return False  # "loyalty_card_number", "id_card_number"; "guest_card_number" is a checkout's
    if "captcha" in words or _NOT_PAYMENT_CARD_AFTER.intersection(words):
        return False
    joined = [word for word in words if word not in _CONNECTORS]
    if _SECURITY_CODE_WORDS.intersection(joined) or any(
        pair in _SECURITY_CODE_PAIRS for pair in zip(joined, joined[1:], strict=False)
    ):
        return bool(_CARD_WORDS.intersection(joined))  # a captcha's, unless a card is named
    for index, word in enumerate(joined):
        for card in _COMPOUND_CARD_WORDS:
            if word.endswith(card):
                kind = word[: -len(card)] or (joined[index - 1] if index else "")
                if kind in _COMPOUND_OTHER_KINDS:
                    return False
    if "on" in words and "name" in words:  # "name on card", not "name on badge"
        return "card" in words or "nameoncard" in "".join(words)
    return True


def _name_classes(form: Form, declared: dict[str, str]) -> dict[str, str | None]:
    """Every field name's class, computed once: a form may name thousands of fields."""
    names = {**dict.fromkeys(declared), **dict.fromkeys(form.values or ())}
    return {name: classify_field_name(name) for name in names}


def least_stored_size(values: dict[str, str] | None) -> int:
    """A lower bound on the bytes a form's values take in its stored event.

    Each field stays as `"name":"value"` in `values` or moves to
    `privacyWithheld` as `"name":"class"`: its name, two quotes, a colon and at
    least an empty string's two quotes, in bytes at least one per character.
    """
    if not values:
        return 0
    return sum(map(len, values)) + 5 * len(values)


def apply_form_floor(form: Form, size_limit: int | None = None) -> FloorDecision:
    """Drop a checkout whole; otherwise withhold every sensitive field's value.

    With a `size_limit`, a form whose values alone cannot fit in it comes back
    with `too_large` set and nothing else worked out: its values need not be
    classified or sealed to know it is refused. A checkout is still dropped,
    whatever its size, as without the limit.
    """
    declared = _declared_types(form.raw_fields)
    name_classes = _name_classes(form, declared)
    if is_checkout(form, declared, name_classes):
        return FloorDecision("checkout_form", form)
    values = form.values or {}
    if size_limit is not None and (least := least_stored_size(values)) > size_limit:
        return FloorDecision(None, form, too_large=least)
    withheld: dict[str, str] = {}
    for name, value in values.items():
        kind = name_classes[name] or classify_value(value)
        if kind is None and name in declared:
            kind = classify_field_type(declared[name])
        if kind is not None:
            withheld[name] = kind
    files = form.files
    kept_files: list[FileMeta] | None = None
    if files:
        kept_files = [f for f in files if f.field is None or classify_field_name(f.field) is None]
        for entry in files:
            if entry.field is not None and entry not in kept_files:
                withheld[entry.field] = classify_field_name(entry.field) or "sensitive"
    if not withheld:
        return FloorDecision(None, form)
    kept_values = {k: v for k, v in values.items() if k not in withheld}
    kept = msgspec.structs.replace(
        form,
        values=kept_values if form.values is not None else None,
        files=kept_files if files is not None else None,
    )
    return FloorDecision(None, kept, dict(sorted(withheld.items())))
